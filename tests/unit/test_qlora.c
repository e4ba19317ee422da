// test_qlora.c: QLoRA (LoRA adapters over a frozen NF4 base held only quantised, quant_base.h)
// against PEFT + bitsandbytes 0.50 on the CPU (fixtures from tests/reference/make_qlora_fixtures.py:
// get_peft_model over transformers' models loaded with BitsAndBytesConfig(load_in_4bit=True, nf4,
// double quantisation on and off), tiny GPT-2 and LLaMA):
//   * logits, loss and every adapter gradient within 1e-5 relative of the float64 maths of the same
//     dequantised weights, and within 1e-5 of PEFT + bitsandbytes' own float32 values;
//   * 10 AdamW steps track PEFT + bitsandbytes' losses; the base codes and scales keep every bit;
//   * the model holds no fp32 slot for a quantised weight (the flat buffer is the full-precision
//     tensors plus one placeholder per linear) and no gradient buffer;
//   * the memory estimate's quantised bytes equal what the base holds.
#include "test.h"
#include "test_fixture.h"

#include "shardlm/error.h"
#include "shardlm/lora.h"
#include "shardlm/memory_estimate.h"
#include "shardlm/model.h"
#include "shardlm/optim.h"
#include "shardlm/peft_adapter.h"
#include "shardlm/quant_base.h"
#include "shardlm/safetensors.h"

#define REL_TOL 1e-5

typedef struct {
    sl_model model;
    sl_quant_base qb;
    sl_lora lora;
    sl_st_file expected;
    int *inputs, *targets;
    int B, T;
} fixture;

static int load_fixture(fixture *fx, const char *base, const char *name, int double_quant) {
    char dir[256];
    memset(fx, 0, sizeof *fx);
    snprintf(dir, sizeof dir, "tests/fixtures/quant/%s", base);
    sl_model_source src;
    sl_quant_config qc;
    CHECK(sl_quant_config_from_flag("nf4", &qc) == 0);
    qc.double_quant = double_quant;
    if (sl_model_source_resolve(&src, dir) || sl_quant_base_create(&fx->qb, &fx->model, &src, &qc, &sl_ops_cpu, 0)) {
        fprintf(stderr, "  %s\n", sl_error());
        return -1;
    }
    snprintf(dir, sizeof dir, "tests/fixtures/qlora/%s", name);
    if (fixture_attach_adapter(dir, &src.cfg, &fx->model, &fx->lora)) return -1;
    return fixture_expected(dir, &fx->expected, &fx->inputs, &fx->targets, &fx->B, &fx->T);
}

static void free_fixture(fixture *fx) {
    sl_model_free(&fx->model);
    sl_lora_free(&fx->lora);
    sl_quant_base_free(&fx->qb);
    sl_st_close(&fx->expected);
    free(fx->inputs);
    free(fx->targets);
}

// Largest |got - want| over the largest |want| for the fixture tensor `name`.
static double rel_error(const sl_st_file *f, const char *name, const float *got, size_t n) {
    size_t wn = 0;
    float *want = fixture_tensor(f, name, &wn);
    if (!want || wn != n) { free(want); return INFINITY; }
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs(got[i] - want[i]));
    worst /= fmax(fixture_max_abs(want, n), 1e-30);
    free(want);
    return worst;
}

static void check_against_peft(const char *base, const char *name, int double_quant) {
    fixture fx;
    if (load_fixture(&fx, base, name, double_quant)) { CHECK(0); free_fixture(&fx); return; }
    sl_model *m = &fx.model;
    CHECK(m->grads == NULL);   // frozen base: no gradient buffer
    CHECK(fx.qb.qm.qc.double_quant == double_quant);
    size_t placeholders = 0, full = 0;
    for (int t = 0; t < m->layout.n_tensors; t++) {
        placeholders += m->layout.tensors[t].quantised;
        full += m->layout.tensors[t].quantised ? 0 : m->layout.tensors[t].numel;
    }
    CHECK_MSG(placeholders == (size_t)m->cfg.n_layer * (m->cfg.arch == SL_ARCH_LLAMA ? 7 : 4), "%zu quantised tensors",
              placeholders);
    CHECK_MSG(m->layout.total == full + placeholders, "flat buffer %zu floats, full-precision %zu + %zu placeholders",
              m->layout.total, full, placeholders);
    sl_memory_quant_base est;
    CHECK(sl_memory_quant_base_for(&m->cfg, &fx.qb.qm.qc, &est) == 0);
    CHECK_MSG(est.quantised == (double)sl_quant_base_bytes(&fx.qb) && est.P == (double)m->layout.total,
              "estimate Q %.0f P %.0f, held %zu and %zu", est.quantised, est.P, sl_quant_base_bytes(&fx.qb),
              m->layout.total);

    float loss;
    CHECK(sl_model_forward(m, fx.inputs, fx.targets, fx.B, fx.T, &loss) == 0);
    size_t n = (size_t)fx.B * fx.T * (size_t)m->cfg.vocab_size;
    float *logits = malloc(n * sizeof(float)), *want_loss = fixture_tensor(&fx.expected, "loss", NULL);
    float *bnb_loss = fixture_tensor(&fx.expected, "bnb.loss", NULL);
    CHECK(sl_model_logits(m, 0, fx.B * fx.T, logits) == 0);
    double rel = rel_error(&fx.expected, "logits", logits, n), rel_bnb = rel_error(&fx.expected, "bnb.logits", logits, n);
    CHECK_MSG(rel < REL_TOL && rel_bnb < REL_TOL, "%s logits relative error %.3g (float64), %.3g (bitsandbytes)", name,
              rel, rel_bnb);
    CHECK_MSG(fabs(loss - want_loss[0]) <= REL_TOL * fabs(want_loss[0]) &&
                  fabs(loss - bnb_loss[0]) <= REL_TOL * fabs(bnb_loss[0]),
              "%s loss %.8f vs %.8f (float64), %.8f (bitsandbytes)", name, loss, want_loss[0], bnb_loss[0]);
    sl_model_zero_grad(m);
    CHECK(sl_model_backward(m, 1.0f) == 0);
    double worst = 0, worst_bnb = 0;
    const char *worst_name = "";
    for (int i = 0; i < fx.lora.n_tensors; i++) {
        const sl_tensor_info *t = &fx.lora.tensors[i];
        char g[200];
        snprintf(g, sizeof g, "grad.%s", t->name);
        double r = rel_error(&fx.expected, g, fx.lora.grads + t->offset, t->numel);
        snprintf(g, sizeof g, "bnb.grad.%s", t->name);
        worst_bnb = fmax(worst_bnb, rel_error(&fx.expected, g, fx.lora.grads + t->offset, t->numel));
        if (r > worst) { worst = r; worst_name = t->name; }
    }
    CHECK_MSG(worst < REL_TOL && worst_bnb < REL_TOL, "%s worst adapter gradient relative error %.3g (%s), %.3g vs "
              "bitsandbytes", name, worst, worst_name, worst_bnb);
    printf("  %s: %d adapter tensors; logits rel err %.2e (float64) %.2e (bnb fp32); loss %.7f vs %.7f; worst grad "
           "rel err %.2e (%s), %.2e vs bnb; base %zu B quantised + %zu B fp32\n", name, fx.lora.n_tensors, rel, rel_bnb,
           loss, want_loss[0], worst, worst_name, worst_bnb, sl_quant_base_bytes(&fx.qb),
           m->layout.total * sizeof(float));
    free(logits);
    free(want_loss);
    free(bnb_loss);
    free_fixture(&fx);
}

TEST(gpt2_qlora_nf4_double_quant_matches_peft_bnb) { check_against_peft("gpt2_fp32", "gpt2-nf4-dq", 1); }
TEST(gpt2_qlora_nf4_matches_peft_bnb) { check_against_peft("gpt2_fp32", "gpt2-nf4", 0); }
TEST(llama_qlora_nf4_double_quant_all_linear_matches_peft_bnb) { check_against_peft("llama_fp32", "llama-nf4-dq", 1); }
TEST(llama_qlora_nf4_rslora_q_v_up_down_matches_peft_bnb) { check_against_peft("llama_fp32", "llama-nf4", 0); }

// Copies of every quantised tensor's codes and scales, to compare after training.
static size_t snapshot(const sl_quant_base *qb, unsigned char **out) {
    size_t total = 0;
    for (int t = 0; t < qb->qm.n_tensors; t++)
        if (qb->qm.q[t].type != SL_QUANT_NONE) total += sl_qtensor_bytes(&qb->qm.q[t]);
    unsigned char *p = malloc(total ? total : 1);
    size_t at = 0;
    for (int t = 0; t < qb->qm.n_tensors; t++) {
        const sl_qtensor *q = &qb->qm.q[t];
        if (q->type == SL_QUANT_NONE) continue;
        size_t codes = (q->numel + 1) / 2;
        memcpy(p + at, q->data, codes);
        at += codes;
        if (q->nested) {
            memcpy(p + at, q->qabsmax, q->n_blocks);
            at += q->n_blocks;
            size_t nn = (q->n_blocks + SL_QUANT_NESTED_BLOCK - 1) / SL_QUANT_NESTED_BLOCK;
            memcpy(p + at, q->nested_absmax, nn * sizeof(float));
            at += nn * sizeof(float);
        } else {
            memcpy(p + at, q->absmax, q->n_blocks * sizeof(float));
            at += q->n_blocks * sizeof(float);
        }
    }
    *out = p;
    return at;
}

// 10 AdamW steps on the adapters (as torch.optim.AdamW over PEFT's trainable parameters).
static void check_adamw_track(const char *base, const char *name, int double_quant) {
    fixture fx;
    if (load_fixture(&fx, base, name, double_quant)) { CHECK(0); free_fixture(&fx); return; }
    float *want = fixture_tensor(&fx.expected, "adamw_losses", NULL);
    size_t nb = fx.model.layout.total * sizeof(float);
    float *fp_before = malloc(nb);
    memcpy(fp_before, fx.model.params, nb);
    unsigned char *codes_before, *codes_after;
    size_t nc = snapshot(&fx.qb, &codes_before);
    double worst = fixture_adamw_track(&fx.model, fx.lora.params, fx.lora.grads, fx.lora.total, fx.inputs, fx.targets,
                                       fx.B, fx.T, want, 10, name);
    CHECK_MSG(worst < 1e-4, "%s adamw loss curve deviates by %.3g relative", name, worst);
    CHECK(snapshot(&fx.qb, &codes_after) == nc);
    CHECK_MSG(memcmp(codes_before, codes_after, nc) == 0, "%s: a base code or scale changed", name);
    CHECK_MSG(memcmp(fp_before, fx.model.params, nb) == 0, "%s: a full-precision base tensor changed", name);
    free(codes_before);
    free(codes_after);
    free(fp_before);
    free(want);
    free_fixture(&fx);
}

TEST(gpt2_qlora_adamw_tracks_peft_bnb) { check_adamw_track("gpt2_fp32", "gpt2-nf4-dq", 1); }
TEST(llama_qlora_adamw_tracks_peft_bnb) { check_adamw_track("llama_fp32", "llama-nf4-dq", 1); }
TEST(llama_qlora_no_double_quant_adamw_tracks_peft_bnb) { check_adamw_track("llama_fp32", "llama-nf4", 0); }

// NF4 on a weight whose size is not a multiple of the block: refused by name, nothing allocated.
TEST(nf4_on_a_partial_block_refused) {
    sl_model_config cfg;
    CHECK(sl_config_preset(&cfg, "gpt2-tiny") == 0);
    cfg.n_embd = 36;   // c_attn (108, 36): 3888 elements, 60.75 blocks of 64
    cfg.n_inner = 4 * 36;
    cfg.n_head = cfg.n_kv_head = 4;
    cfg.head_dim = 9;
    CHECK_MSG(sl_config_validate(&cfg, "test") == 0, "%s", sl_error());
    sl_model_source src = {cfg, 0, ""};
    sl_quant_config qc;
    CHECK(sl_quant_config_from_flag("nf4", &qc) == 0);
    sl_model m;
    sl_quant_base qb;
    int rc = sl_quant_base_create(&qb, &m, &src, &qc, &sl_ops_cpu, 1);
    CHECK(rc != 0);
    CHECK_MSG(strstr(sl_error(), "c_attn.weight") && strstr(sl_error(), "multiple"), "message: %s", sl_error());
    CHECK(qb.qm.q == NULL && !qb.installed);
}

TEST(quantised_base_refuses_other_tables) {
    sl_model_source src;
    CHECK(sl_model_source_resolve(&src, "tests/fixtures/quant/llama_fp32") == 0);
    sl_quant_config qc;
    CHECK(sl_quant_config_from_flag("int8", &qc) == 0);
    sl_model m;
    sl_quant_base qb;
    CHECK(sl_quant_base_create(&qb, &m, &src, &qc, &sl_ops_cpu_bf16, 0) != 0);
    CHECK_MSG(strstr(sl_error(), "CPU's fp32 ops only") != NULL, "message: %s", sl_error());
}

TEST_MAIN()
