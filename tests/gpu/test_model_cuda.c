// test_model_cuda.c: the whole model on the GPU against the CPU fp32 path (part of tests/gpu/suite.sh).
// For gpt2-tiny and llama-tiny (GQA, RoPE, SwiGLU, untied head) with the same initial weights and
// batch, one forward + backward on each backend: the loss, every logit and every parameter gradient
// are compared (relative to each tensor's largest magnitude). Then 5 AdamW steps through the engine
// on each: the updated weights agree, and two GPU runs are bit-identical (deterministic kernels).
// The forward runs the fused ops (GEMM + GELU epilogue, residual + norm) on both backends. Then the
// same batch with bf16-rounded weights and sl_model.precision = bf16 on the GPU (GEMMs in
// CUBLAS_COMPUTE_32F_FAST_16BF) against the CPU's fp32 forward on the same weights: the loss within
// 2e-2 and the logits within 5e-2 relative (bf16 keeps 8 significant bits of every activation a GEMM reads).
// Then bf16 activation storage (sl_ops_cuda_bf16) against the CPU's emulation of it (check_bf16_storage),
// for the presets (head_dim 8: SIMT attention) and with 2 heads (head_dim 16: tensor-core attention,
// by default the mma.sync kernels of attention_mma.cu, checked to have run by their launch counter);
// last (a fault there cannot hide the others), the 2-head cases again with SHARDLM_ATTENTION=tc (the
// WMMA kernels of attention_tc.cu). Then LoRA (check_lora): a model with adapters on every linear
// trained on the GPU against the same on the CPU, fp32 and bf16 storage.
// Usage: test_model_cuda [DEVICE]   (default cuda:0). Prints PASS/FAIL lines, "N passed, N failed".
#include "shardlm/engine.h"
#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/peft_adapter.h"
#include "shardlm/precision.h"
#include "shardlm/settings.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"
#include "ops/cuda/cuda_ops.h"  // cuda_attention_mma_launches


static float *download(const sl_model *m, const float *p, size_t n) {
    float *h = malloc(n * sizeof(float));
    m->ops->download(h, p, n * sizeof(float));
    return h;
}

// The last forward's logits (rows x vocab, widened from bf16 storage) on the host.
static float *logits_of(const sl_model *m, int rows) {
    float *h = malloc((size_t)rows * m->cfg.vocab_size * sizeof(float));
    if (h && sl_model_logits(m, 0, rows, h)) {
        free(h);
        return NULL;
    }
    return h;
}

// The engine of the training checks: AdamW at a constant lr, weight decay 0.1, clipping at 1.
static sl_engine_config adamw_config(int B, double lr) {
    sl_engine_config ec = {.micro_batch = B, .grad_accum_steps = 1, .gradient_clipping = 1.0f};
    sl_optim_defaults(&ec.optim);
    ec.optim.lr = lr;
    ec.optim.weight_decay = 0.1;
    sl_schedule_constant(&ec.schedule, ec.optim.lr);
    sl_loss_scaler_defaults(&ec.precision);
    return ec;
}

// 5 AdamW steps through the engine; returns the final weights on the host.
static float *train5(const sl_model_config *cfg, const sl_ops *ops, const int *in, const int *tg, int B, int T) {
    sl_model m;
    if (sl_model_create(&m, cfg, ops) || sl_model_init_weights(&m, 5)) return NULL;
    sl_engine_config ec = adamw_config(B, 1e-3);
    sl_engine e;
    if (sl_engine_init(&e, &m, &ec)) {
        sl_model_free(&m);
        return NULL;
    }
    for (int s = 0; s < 5; s++)
        if (sl_engine_forward_backward(&e, in, tg, B, T, NULL) || sl_engine_step(&e)) {
            sl_engine_free(&e);  // also ends the engine's count (SHARDLM_ATTENTION=auto)
            sl_model_free(&m);
            return NULL;
        }
    float *w = download(&m, m.params, m.layout.total);
    sl_engine_free(&e);
    sl_model_free(&m);
    return w;
}

// A batch of B = 2 rows of T <= 48 tokens: in[i] = (i*ia + ib) % V, tg[i] = (i*ta + tb) % V, except
// tg[i] = -1 (ignored) where i % skip == skip_at (skip 0: none).
static void make_batch(const sl_model_config *cfg, int ia, int ib, int ta, int tb, int skip, int skip_at, int *B,
                       int *T, int **in, int **tg) {
    *B = 2;
    *T = cfg->max_seq_len < 48 ? cfg->max_seq_len : 48;
    *in = malloc(sizeof(int) * *B * *T);
    *tg = malloc(sizeof(int) * *B * *T);
    for (int i = 0; i < *B * *T; i++) {
        (*in)[i] = (i * ia + ib) % cfg->vocab_size;
        (*tg)[i] = skip && i % skip == skip_at ? -1 : (i * ta + tb) % cfg->vocab_size;
    }
}

// The largest per-tensor relative difference of gradients `got` (host) from ref's, and where.
static double worst_gradient(const sl_model *ref, const float *got, const char **where) {
    double worst = 0;
    *where = "";
    for (int t = 0; got && t < ref->layout.n_tensors; t++) {
        const sl_tensor_info *ti = &ref->layout.tensors[t];
        double r = rel_diff(got + ti->offset, ref->grads + ti->offset, ti->numel);
        if (r > worst) { worst = r; *where = ti->name; }
    }
    return worst;
}

static void check_preset(const char *preset, const sl_ops *gpu) {
    sl_model_config cfg;
    if (sl_config_preset(&cfg, preset)) { report(0, preset, "exact", 0); return; }
    int B, T, *in, *tg;
    make_batch(&cfg, 37, 11, 53, 5, 7, 3, &B, &T, &in, &tg);  // some ignored targets
    sl_model c, g;
    if (sl_model_create(&c, &cfg, &sl_ops_cpu) || sl_model_create(&g, &cfg, gpu) || sl_model_init_weights(&c, 5) ||
        sl_model_init_weights(&g, 5)) {
        printf("FAIL %s_setup: %s\n", preset, sl_error());
        failed++;
        return;
    }
    float lc, lg;
    char name[128];
    int ok = !sl_model_forward(&c, in, tg, B, T, &lc) && !sl_model_forward(&g, in, tg, B, T, &lg);
    size_t nlog = (size_t)B * T * cfg.vocab_size;
    float *glog = ok ? logits_of(&g, B * T) : NULL, *clog = ok ? logits_of(&c, B * T) : NULL;
    ok = ok && glog && clog;
    snprintf(name, sizeof name, "%s_logits_match_cpu", preset);
    report(ok && rel_diff(glog, clog, nlog) <= 1e-5, name, "max rel err %.2e", ok ? rel_diff(glog, clog, nlog) : -1);
    free(clog);
    snprintf(name, sizeof name, "%s_loss_matches_cpu", preset);
    report(ok && fabs(lg - lc) <= 1e-5 * fabs(lc), name, "rel err %.2e", fabs(lg - lc) / fabs(lc));
    ok = ok && !sl_model_backward(&c, 1.0f) && !sl_model_backward(&g, 1.0f);
    float *ggrad = ok ? download(&g, g.grads, g.layout.total) : NULL;
    const char *where;
    double worst = worst_gradient(&c, ggrad, &where);
    snprintf(name, sizeof name, "%s_gradients_match_cpu(worst %s)", preset, where);
    report(ok && worst <= 1e-4, name, "max rel err %.2e", worst);
    // the fused classifier (sl_model_expect_backward: loss and dlogits in forward) gives the same bits
    sl_model f;
    float lf = 0.0f;
    int fok = ok && ggrad && !sl_model_create(&f, &cfg, gpu);
    if (fok) {
        fok = !sl_model_init_weights(&f, 5);
        sl_model_expect_backward(&f, 1.0f);
        fok = fok && !sl_model_forward(&f, in, tg, B, T, &lf) && !sl_model_backward(&f, 1.0f);
        float *fgrad = fok ? download(&f, f.grads, f.layout.total) : NULL;
        fok = fok && fgrad && !memcmp(&lf, &lg, sizeof lf) && !memcmp(fgrad, ggrad, f.layout.total * sizeof(float));
        free(fgrad);
        sl_model_free(&f);
    }
    snprintf(name, sizeof name, "%s_fused_classifier_equals_separate_bits", preset);
    report(fok, name, "exact", 0);
    free(glog);
    free(ggrad);
    sl_model_free(&c);
    sl_model_free(&g);

    float *wc = train5(&cfg, &sl_ops_cpu, in, tg, B, T), *w1 = train5(&cfg, gpu, in, tg, B, T),
          *w2 = train5(&cfg, gpu, in, tg, B, T);
    size_t n = 0;
    sl_param_layout L;
    if (!sl_layout_build(&L, &cfg)) { n = L.total; sl_layout_free(&L); }
    snprintf(name, sizeof name, "%s_5_adamw_steps_match_cpu", preset);
    report(wc && w1 && rel_diff(w1, wc, n) <= 1e-4, name, "max rel err %.2e", wc && w1 ? rel_diff(w1, wc, n) : -1);
    snprintf(name, sizeof name, "%s_gpu_training_is_deterministic", preset);
    report(w1 && w2 && !memcmp(w1, w2, n * sizeof(float)), name, "exact", 0);
    free(wc);
    free(w1);
    free(w2);
    free(in);
    free(tg);
}

// The forward under bf16 compute on the GPU against the CPU's fp32 forward, both on bf16-rounded weights.
static void check_bf16_compute(const char *preset, const sl_ops *gpu) {
    sl_model_config cfg;
    char name[128];
    if (sl_config_preset(&cfg, preset)) { report(0, preset, "exact", 0); return; }
    int B, T, *in, *tg;
    make_batch(&cfg, 31, 7, 43, 1, 0, 0, &B, &T, &in, &tg);
    sl_model c, g;
    if (sl_model_create(&c, &cfg, &sl_ops_cpu) || sl_model_create(&g, &cfg, gpu) || sl_model_init_weights(&c, 9) ||
        sl_model_init_weights(&g, 9)) {
        printf("FAIL %s_bf16_setup: %s\n", preset, sl_error());
        failed++;
        free(in);
        free(tg);
        return;
    }
    c.ops->round_to(c.params, c.layout.total, SL_PRECISION_BF16);  // what the engine's bf16 model holds
    g.ops->round_to(g.params, g.layout.total, SL_PRECISION_BF16);
    g.precision = SL_PRECISION_BF16;
    float lc = 0, lg = 0;
    int ok = !sl_model_forward(&c, in, tg, B, T, &lc) && !sl_model_forward(&g, in, tg, B, T, &lg);
    size_t nlog = (size_t)B * T * cfg.vocab_size;
    float *glog = ok ? logits_of(&g, B * T) : NULL, *clog = ok ? logits_of(&c, B * T) : NULL;
    ok = ok && glog && clog;
    double el = ok ? rel_diff(glog, clog, nlog) : -1, eloss = fabs(lg - lc) / fabs(lc);
    free(clog);
    snprintf(name, sizeof name, "%s_bf16_compute_loss_near_fp32", preset);
    report(ok && eloss <= 2e-2, name, "rel err %.2e", eloss);
    snprintf(name, sizeof name, "%s_bf16_compute_logits_near_fp32", preset);
    report(ok && el <= 5e-2, name, "max rel err %.2e", el);
    free(glog);
    sl_model_free(&c);
    sl_model_free(&g);
    free(in);
    free(tg);
}

// bf16 activation storage (sl_ops_cuda_bf16) against the CPU's emulation of it (sl_ops_cpu_bf16) on
// the same weights and batch: loss, logits (bf16, widened) and fp32 parameter gradients. Each op
// rounds its outputs once, so where the GPU's fp32 sums differ from the CPU's in the last bits an
// activation may land one bf16 step (2^-8 relative) away, and that propagates: the bounds are
// bf16's, not fp32's. Also the arena is about half the fp32 one, and 5 AdamW steps through the
// engine on the GPU are bit-identical run to run. n_head > 0 replaces the preset's head count (and
// scales n_kv_head with it): the tiny presets' head_dim 8 runs the SIMT attention kernels, 2 heads
// (head_dim 16) the tensor-core ones (attention_mma.cu by default).
// tag: appended to the preset's name in the test names ("" or "_mma").
static void check_bf16_storage(const char *preset, int n_head, const sl_ops *gpu_bf16, const char *tag) {
    sl_model_config cfg;
    char name[160];
    if (sl_config_preset(&cfg, preset)) { report(0, preset, "exact", 0); return; }
    char label[64];
    snprintf(label, sizeof label, "%s%s", preset, tag);
    if (n_head > 0) {
        cfg.n_kv_head = cfg.n_kv_head * n_head / cfg.n_head > 0 ? cfg.n_kv_head * n_head / cfg.n_head : 1;
        cfg.n_head = n_head;
        cfg.head_dim = 0;  // the preset's is for its own head count: n_embd / n_head again
        if (sl_config_validate(&cfg, preset)) {
            printf("FAIL %s%s_heads%d_config: %s\n", preset, tag, n_head, sl_error());
            failed++;
            return;
        }
        snprintf(label, sizeof label, "%s%s_hd%d", preset, tag, sl_config_head_dim(&cfg));
    }
    preset = label;
    int B, T, *in, *tg;
    make_batch(&cfg, 29, 3, 41, 2, 9, 4, &B, &T, &in, &tg);
    sl_model c, g, f;
    if (sl_model_create(&c, &cfg, &sl_ops_cpu_bf16) || sl_model_create(&g, &cfg, gpu_bf16) ||
        sl_model_create(&f, &cfg, &sl_ops_cpu) || sl_model_init_weights(&c, 7) || sl_model_init_weights(&g, 7) ||
        sl_model_init_weights(&f, 7) ||
        sl_model_params_changed(&c) || sl_model_params_changed(&g)) {
        printf("FAIL %s_bf16_storage_setup: %s\n", preset, sl_error());
        failed++;
        free(in);
        free(tg);
        return;
    }
    float lc = 0, lg = 0, lf = 0;
    int ok = !sl_model_forward(&c, in, tg, B, T, &lc) && !sl_model_forward(&g, in, tg, B, T, &lg) &&
             !sl_model_forward(&f, in, tg, B, T, &lf);
    size_t nlog = (size_t)B * T * cfg.vocab_size;
    float *glog = ok ? logits_of(&g, B * T) : NULL, *clog = ok ? logits_of(&c, B * T) : NULL;
    ok = ok && glog && clog;
    snprintf(name, sizeof name, "%s_bf16_storage_loss_matches_emulation", preset);
    report(ok && fabs(lg - lc) <= 1e-2 * fabs(lc), name, "rel err %.2e", fabs(lg - lc) / fabs(lc));
    snprintf(name, sizeof name, "%s_bf16_storage_loss_near_fp32", preset);
    report(ok && fabs(lg - lf) <= 2e-2 * fabs(lf), name, "rel err %.2e", fabs(lg - lf) / fabs(lf));
    snprintf(name, sizeof name, "%s_bf16_storage_logits_match_emulation", preset);
    report(ok && rel_diff(glog, clog, nlog) <= 5e-2, name, "max rel err %.2e", ok ? rel_diff(glog, clog, nlog) : -1);
    ok = ok && !sl_model_backward(&c, 1.0f) && !sl_model_backward(&g, 1.0f);
    float *ggrad = ok ? download(&g, g.grads, g.layout.total) : NULL;
    const char *where;
    double worst = worst_gradient(&c, ggrad, &where);
    snprintf(name, sizeof name, "%s_bf16_storage_gradients_match_emulation(worst %s)", preset, where);
    report(ok && worst <= 5e-2, name, "max rel err %.2e", worst);
    double ratio = (double)g.act_bytes / (double)f.act_bytes;
    snprintf(name, sizeof name, "%s_bf16_storage_halves_activations", preset);
    report(g.act_elem == 2 && ratio < 0.55, name, "arena ratio %.3f", ratio);
    free(glog);
    free(clog);
    free(ggrad);
    sl_model_free(&c);
    sl_model_free(&g);
    sl_model_free(&f);

    float *w1 = train5(&cfg, gpu_bf16, in, tg, B, T), *w2 = train5(&cfg, gpu_bf16, in, tg, B, T);
    size_t n = 0;
    sl_param_layout L;
    if (!sl_layout_build(&L, &cfg)) { n = L.total; sl_layout_free(&L); }
    snprintf(name, sizeof name, "%s_bf16_storage_training_is_deterministic", preset);
    report(w1 && w2 && !memcmp(w1, w2, n * sizeof(float)), name, "exact", 0);
    free(w1);
    free(w2);
    free(in);
    free(tg);
}

// ---- LoRA ------------------------------------------------------------------------------------------

// A model of cfg on ops with gpu_check.h's test adapters (dropout 0.1, on while training) and their
// gradient buffer.
static int lora_model(sl_model *m, sl_lora *lo, const sl_model_config *cfg, const sl_ops *ops) {
    memset(m, 0, sizeof *m);
    memset(lo, 0, sizeof *lo);
    if (sl_model_create(m, cfg, ops) || sl_model_init_weights(m, 5) || attach_test_lora(m, lo, 0.1f) ||
        sl_lora_alloc_grads(lo) || sl_model_params_changed(m))
        return -1;
    lo->training = 1;
    lo->dropout_seed = 42;
    return 0;
}

// The largest per-tensor relative difference of adapter gradients `got` from `ref`'s (both host), and where.
static double worst_adapter(const sl_lora *lo, const float *got, const float *ref, const char **where) {
    double worst = 0;
    *where = "";
    for (int t = 0; got && ref && t < lo->n_tensors; t++) {
        double r = rel_diff(got + lo->tensors[t].offset, ref + lo->tensors[t].offset, lo->tensors[t].numel);
        if (r > worst) { worst = r; *where = lo->tensors[t].name; }
    }
    return worst;
}

// 5 AdamW steps of the adapters on ops (a batch a step, dropout keyed by the step); the adapters after
// them on the host. base_same: whether the frozen base ended bit-identical to its initial weights.
// save_root non-NULL: the engine also saves step 5 there (a PEFT adapter directory, save_root/final).
static float *lora_train5(const sl_model_config *cfg, const sl_ops *ops, const int *in, const int *tg, int B, int T,
                          int *base_same, const char *save_root) {
    sl_model m;
    sl_lora lo;
    sl_engine e;
    float *w = NULL, *base0 = NULL, *base1 = NULL;
    int engine = 0;
    *base_same = 0;
    sl_engine_config ec = adamw_config(B, 1e-2);
    if (lora_model(&m, &lo, cfg, ops)) goto done;
    base0 = download(&m, m.params, m.layout.total);
    if (sl_engine_init(&e, &m, &ec)) goto done;
    engine = 1;
    for (int s = 0; s < 5; s++) {
        lo.dropout_seed = 1000 + (uint64_t)s;
        if (sl_engine_forward_backward(&e, in, tg, B, T, NULL) || sl_engine_step(&e)) goto done;
    }
    if (save_root && sl_engine_save(&e, save_root, "final", NULL)) goto done;
    base1 = download(&m, m.params, m.layout.total);
    *base_same = base0 && base1 && !memcmp(base0, base1, m.layout.total * sizeof(float));
    w = malloc(lo.total * sizeof(float));
    if (w) ops->download(w, lo.params, lo.total * sizeof(float));
done:
    if (!w) printf("  lora training on %s: %s\n", ops->name, sl_error());
    if (engine) sl_engine_free(&e);
    sl_model_free(&m);
    sl_lora_free(&lo);
    free(base0);
    free(base1);
    return w;
}

// Adapters on every linear of `preset`, on `dev` against `ref` (the CPU's fp32 table for the GPU's
// fp32 one; the CPU's bf16 emulation for bf16 storage): one forward + backward with dropout: the loss
// within tol_loss, the logits within tol_logits and every adapter gradient within tol_grad (relative
// to each tensor's largest); then 5 AdamW steps through the engine: with tol_trained > 0 the adapters
// within it of ref's (not under bf16: AdamW's first steps move every weight by about lr whatever its
// gradient's size, so an element whose bf16 gradient lands on the other side of 0 moves the other
// way), the frozen base bit-identical to its initial weights, two runs on dev bit-identical, and the
// checkpoint dev's engine saved (a PEFT directory) reads back on the CPU as exactly dev's adapters.
static void check_lora(const char *preset, const sl_ops *dev, const sl_ops *ref, const char *tag, double tol_loss,
                       double tol_logits, double tol_grad, double tol_trained) {
    sl_model_config cfg;
    char name[192];
    if (sl_config_preset(&cfg, preset)) { report(0, preset, "exact", 0); return; }
    int B, T, *in, *tg;
    make_batch(&cfg, 23, 5, 47, 3, 11, 6, &B, &T, &in, &tg);
    sl_model c, g;
    sl_lora lc, lg;
    if (lora_model(&c, &lc, &cfg, ref) || lora_model(&g, &lg, &cfg, dev)) {
        printf("FAIL %s_lora%s_setup: %s\n", preset, tag, sl_error());
        failed++;
        free(in);
        free(tg);
        return;
    }
    float loss_c = 0, loss_g = 0;
    int ok = !sl_model_forward(&c, in, tg, B, T, &loss_c) && !sl_model_forward(&g, in, tg, B, T, &loss_g);
    size_t nlog = (size_t)B * T * cfg.vocab_size;
    float *glog = ok ? logits_of(&g, B * T) : NULL, *clog = ok ? logits_of(&c, B * T) : NULL;
    ok = ok && glog && clog;
    snprintf(name, sizeof name, "%s_lora%s_loss_matches_cpu", preset, tag);
    report(ok && fabs(loss_g - loss_c) <= tol_loss * fabs(loss_c), name, "rel err %.2e",
           fabs(loss_g - loss_c) / fabs(loss_c));
    snprintf(name, sizeof name, "%s_lora%s_logits_match_cpu", preset, tag);
    report(ok && rel_diff(glog, clog, nlog) <= tol_logits, name, "max rel err %.2e", ok ? rel_diff(glog, clog, nlog) : -1);
    ok = ok && !sl_model_backward(&c, 1.0f) && !sl_model_backward(&g, 1.0f);
    float *gg = ok ? malloc(lg.total * sizeof(float)) : NULL, *cg = ok ? malloc(lc.total * sizeof(float)) : NULL;
    if (gg && cg) {
        dev->download(gg, lg.grads, lg.total * sizeof(float));
        ref->download(cg, lc.grads, lc.total * sizeof(float));
    }
    const char *where;
    double worst = gg && cg ? worst_adapter(&lc, gg, cg, &where) : -1;
    snprintf(name, sizeof name, "%s_lora%s_adapter_gradients_match_cpu(worst %s)", preset, tag, gg && cg ? where : "");
    report(gg && cg && worst <= tol_grad, name, "max rel err %.2e", worst);
    // every tensor got a gradient: a B or A left at 0 would pass the comparison without testing it
    int all = gg != NULL;
    for (int t = 0; all && t < lg.n_tensors; t++) {
        double mx = 0;
        for (size_t i = 0; i < lg.tensors[t].numel; i++) mx = fmax(mx, fabs((double)gg[lg.tensors[t].offset + i]));
        all = mx > 0;
    }
    snprintf(name, sizeof name, "%s_lora%s_every_adapter_has_a_gradient", preset, tag);
    report(all, name, "exact", 0);
    size_t n_adapter = lg.total;
    free(gg);
    free(cg);
    free(glog);
    free(clog);
    sl_model_free(&c);
    sl_model_free(&g);
    sl_lora_free(&lc);
    sl_lora_free(&lg);

    char root[] = "/tmp/shardlm_gpu_lora_XXXXXX";
    int have_root = mkdtemp(root) != NULL;
    int same_c = 0, same_1 = 0, same_2 = 0;
    float *wc = lora_train5(&cfg, ref, in, tg, B, T, &same_c, NULL);
    float *w1 = lora_train5(&cfg, dev, in, tg, B, T, &same_1, have_root ? root : NULL);
    float *w2 = lora_train5(&cfg, dev, in, tg, B, T, &same_2, NULL);
    if (tol_trained > 0) {
        snprintf(name, sizeof name, "%s_lora%s_5_adamw_steps_match_cpu", preset, tag);
        report(wc && w1 && rel_diff(w1, wc, n_adapter) <= tol_trained, name, "max rel err %.2e",
               wc && w1 ? rel_diff(w1, wc, n_adapter) : -1);
    }
    snprintf(name, sizeof name, "%s_lora%s_base_weights_unchanged", preset, tag);
    report(w1 && same_1 && same_c, name, "exact", 0);
    snprintf(name, sizeof name, "%s_lora%s_gpu_training_is_deterministic", preset, tag);
    report(w1 && w2 && !memcmp(w1, w2, n_adapter * sizeof(float)), name, "exact", 0);
    // the saved adapters, read back on the CPU, are the GPU's own
    char dir[sizeof root + 16];
    snprintf(dir, sizeof dir, "%s/final", root);
    sl_lora back;
    memset(&back, 0, sizeof back);
    int loaded = have_root && w1 && !sl_peft_load(dir, &cfg, &sl_ops_cpu, &back);
    if (have_root && w1 && !loaded) printf("  %s\n", sl_error());
    snprintf(name, sizeof name, "%s_lora%s_saved_adapters_read_back_exactly", preset, tag);
    report(loaded && back.total == n_adapter && !memcmp(back.params, w1, n_adapter * sizeof(float)), name, "exact", 0);
    if (loaded) sl_lora_free(&back);
    if (have_root) sl_remove_tree(root);
    free(wc);
    free(w1);
    free(w2);
    free(in);
    free(tg);
}

int main(int argc, char **argv) {
    const sl_ops *gpu = gpu_open(argc, argv);
    if (!gpu) return 1;
    check_preset("gpt2-tiny", gpu);
    check_preset("llama-tiny", gpu);
    check_bf16_compute("gpt2-tiny", gpu);
    check_bf16_compute("llama-tiny", gpu);
    const sl_ops *gpu_bf16 = sl_ops_for_precision(gpu, SL_PRECISION_BF16);
    check_bf16_storage("gpt2-tiny", 0, gpu_bf16, "");
    check_bf16_storage("llama-tiny", 0, gpu_bf16, "");
    const unsigned long mma_before = cuda_attention_mma_launches();
    check_bf16_storage("gpt2-tiny", 2, gpu_bf16, "");
    check_bf16_storage("llama-tiny", 2, gpu_bf16, "");
    const unsigned long mma_ran = cuda_attention_mma_launches() - mma_before;
    report(mma_ran > 0, "head_dim16_bf16_storage_ran_attention_mma", "launches %.0f", (double)mma_ran);
    setenv("SHARDLM_ATTENTION", "tc", 1);
    if (sl_settings_load()) {
        printf("FAIL settings_reload_tc: %s\n", sl_error());
        failed++;
    } else {
        check_bf16_storage("gpt2-tiny", 2, gpu_bf16, "_wmma");
        check_bf16_storage("llama-tiny", 2, gpu_bf16, "_wmma");
        report(cuda_attention_mma_launches() == mma_before + mma_ran, "wmma_cases_ran_no_attention_mma",
               "launches %.0f", (double)(cuda_attention_mma_launches() - mma_before - mma_ran));
    }
    unsetenv("SHARDLM_ATTENTION");
    if (sl_settings_load()) {
        printf("FAIL settings_reload_default: %s\n", sl_error());
        failed++;
    }
    // fp32: the bounds of check_preset; bf16 storage: check_bf16_storage's for the loss and logits, and
    // 1e-1 for the adapter gradients, whose A side passes through two more bf16-rounded products (u, du)
    check_lora("gpt2-tiny", gpu, &sl_ops_cpu, "", 1e-5, 1e-5, 1e-4, 1e-4);
    check_lora("llama-tiny", gpu, &sl_ops_cpu, "", 1e-5, 1e-5, 1e-4, 1e-4);
    check_lora("gpt2-tiny", gpu_bf16, &sl_ops_cpu_bf16, "_bf16_storage", 1e-2, 5e-2, 1e-1, 0);
    check_lora("llama-tiny", gpu_bf16, &sl_ops_cpu_bf16, "_bf16_storage", 1e-2, 5e-2, 1e-1, 0);
    // an adapter on LLaMA's untied LM head too (target "lm_head": the logits' vocabulary columns)
    test_lora_targets = "q_proj,v_proj,down_proj,lm_head";
    check_lora("llama-tiny", gpu, &sl_ops_cpu, "_lm_head", 1e-5, 1e-5, 1e-4, 1e-4);
    check_lora("llama-tiny", gpu_bf16, &sl_ops_cpu_bf16, "_lm_head_bf16_storage", 1e-2, 5e-2, 1e-1, 0);
    test_lora_targets = "all-linear";
    return gpu_finish(gpu);
}
