// memory_estimate.c: model-state bytes per rank from a model config and a training setup (see
// memory_estimate.h). The ZeRO formula comes from zero.c; the mixed-precision terms follow what
// engine_precision.c and the model allocate: a master slice unless the fp32 parameters are the master
// (bf16 with bf16 activation storage and no ZeRO), and under act_bf16 a bf16 copy of the whole model,
// which ZeRO-3 replaces by bf16 twins of its parameter windows. With LoRA the formula's buffer is the
// adapters' (lora.h: their table built without buffers), and the frozen base adds 4 bytes a parameter
// (2 more for its bf16 copy under act_bf16), whole on every rank.
#include "shardlm/memory_estimate.h"
#include "shardlm/error.h"
#include "shardlm/layout.h"
#include "shardlm/optim.h"
#include "shardlm/optim_8bit.h"
#include "shardlm/quant.h"
#include "shardlm/zero.h"

#include <string.h>

sl_memory_setup sl_memory_setup_of(const sl_train_config *c, int act_bf16) {
    sl_memory_setup s = {c->world_size, c->zero_stage, sl_optim_num_state_buffers(&c->optim), c->precision.precision,
                         act_bf16 != 0, c->optim.type == SL_OPTIM_ADAMW8BIT, c->optim.min_8bit_size,
                         c->lora_enabled ? &c->lora : NULL};
    return s;
}

int sl_memory_estimate_for(const sl_model_config *model, const sl_memory_setup *setup, sl_memory_estimate *out) {
    memset(out, 0, sizeof *out);
    if (setup->world_size < 1 || setup->zero_stage < 0 || setup->zero_stage > 3 || setup->optim_state_buffers < 0 ||
        setup->optim_state_buffers > 2)
        return sl_errorf("memory estimate: world size %d, ZeRO stage %d and %d optimizer state buffers are not a "
                         "training setup (expected >= 1, 0-3, 0-2)", setup->world_size, setup->zero_stage,
                         setup->optim_state_buffers);
    sl_param_layout layout;
    if (sl_layout_build(&layout, model)) return sl_error_context("memory estimate");
    // what trains (and what ZeRO partitions): the model's buffer, or with LoRA its adapters' alone
    sl_lora adapters;
    memset(&adapters, 0, sizeof adapters);
    if (setup->lora && sl_lora_create(&adapters, model, setup->lora, NULL)) {
        sl_layout_free(&layout);
        return sl_error_context("memory estimate");
    }
    int n_units = setup->lora ? adapters.n_units : layout.n_units, n_tensors = setup->lora ? adapters.n_tensors
                                                                                           : layout.n_tensors;
    const size_t *unit_begin = setup->lora ? adapters.unit_begin : layout.unit_begin;
    const sl_tensor_info *tensors = setup->lora ? adapters.tensors : layout.tensors;
    size_t trained = unit_begin[n_units];
    double frozen = setup->lora ? (double)layout.total : 0.0;
    sl_zero_estimate z = sl_zero_memory_estimate(n_units, unit_begin, setup->world_size, setup->zero_stage,
                                                 setup->optim_state_buffers);
    double windows = (double)sl_zero_window_floats(n_units, unit_begin);
    if (setup->adamw8bit) {  // K from the whole model's 8-bit plan, so KS is a slice's share
        sl_optim_config oc;
        sl_optim_defaults(&oc);
        oc.type = SL_OPTIM_ADAMW8BIT;
        oc.min_8bit_size = setup->min_8bit_size;
        sl_adam8_plan whole = {0};
        if (sl_adam8_plan_build(&whole, tensors, n_tensors, trained, &oc, 0, trained)) {
            sl_lora_free(&adapters);
            sl_layout_free(&layout);
            return sl_error_context("memory estimate");
        }
        double bytes = (double)sl_adam8_state_bytes(&whole);
        sl_adam8_plan_free(&whole);
        z.K = bytes / (double)trained;
        z.optim = setup->zero_stage == 0 ? bytes : z.K * z.S;
    }
    sl_lora_free(&adapters);
    sl_layout_free(&layout);
    out->params = z.params;
    out->grads = z.grads;
    out->optim = z.optim;
    out->P = z.P;
    out->S = z.S;
    out->W = z.W;
    out->K = z.K;
    out->formula = z.formula;
    if (setup->lora) {  // the adapters are the formula's parameters; the frozen base is whole on every rank
        out->adapters = z.params;
        out->params = 4.0 * frozen;
        out->frozen = frozen;
    }
    int mixed = setup->precision != SL_PRECISION_FP32;
    int params_are_master = setup->precision == SL_PRECISION_BF16 && setup->act_bf16 && setup->zero_stage == 0;
    if (mixed && !params_are_master) out->master = 4.0 * z.S;  // S is P at stage 0
    if (setup->act_bf16) out->param_copy = 2.0 * (setup->zero_stage == 3 ? windows : z.P) + 2.0 * frozen;
    out->total = out->params + out->adapters + out->grads + out->optim + out->master + out->param_copy;
    return 0;
}

int sl_memory_quant_base_for(const sl_model_config *model, const sl_quant_config *qc, sl_memory_quant_base *out) {
    memset(out, 0, sizeof *out);
    if (qc->type == SL_QUANT_NONE) return sl_errorf("memory estimate: no quantisation given for the base");
    sl_param_layout layout;
    if (sl_layout_build_quantised(&layout, model)) return sl_error_context("memory estimate");
    out->P = (double)layout.total;
    out->full_precision = 4.0 * (double)layout.total;
    for (int t = 0; t < layout.n_tensors; t++) {
        const sl_tensor_info *x = &layout.tensors[t];
        if (!x->quantised) continue;
        out->quantised_numel += (double)x->numel;
        out->quantised += (double)sl_qtensor_bytes_for(qc->type, x->shape[0], x->shape[1], qc->blocksize,
                                                       qc->double_quant);
    }
    sl_layout_free(&layout);
    return 0;
}
