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
#include "shardlm/quant_config.h"
#include "shardlm/quant_ops.h"
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

static int load_fixture_on(fixture *fx, const char *base, const char *name, int double_quant, const sl_ops *ops) {
    char dir[256];
    memset(fx, 0, sizeof *fx);
    snprintf(dir, sizeof dir, "tests/fixtures/quant/%s", base);
    sl_model_source src;
    sl_quant_config qc;
    CHECK(sl_quant_config_from_flag("nf4", &qc) == 0);
    qc.double_quant = double_quant;
    if (sl_model_source_resolve(&src, dir) || sl_quant_base_create(&fx->qb, &fx->model, &src, &qc, ops, 0)) {
        fprintf(stderr, "  %s\n", sl_error());
        return -1;
    }
    snprintf(dir, sizeof dir, "tests/fixtures/qlora/%s", name);
    if (fixture_attach_adapter(dir, &src.cfg, &fx->model, &fx->lora)) return -1;
    return fixture_expected(dir, &fx->expected, &fx->inputs, &fx->targets, &fx->B, &fx->T);
}

static int load_fixture(fixture *fx, const char *base, const char *name, int double_quant) {
    return load_fixture_on(fx, base, name, double_quant, &sl_ops_cpu);
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
// QDoRA: DoRA's norms over bitsandbytes' dequantised rows (q and v parts of the fused q/k/v linear)
TEST(llama_qdora_nf4_double_quant_matches_peft_bnb) { check_against_peft("llama_fp32", "llama-nf4-dq-dora", 1); }
TEST(gpt2_qdora_nf4_matches_peft_bnb) { check_against_peft("gpt2_fp32", "gpt2-nf4-dora", 0); }

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

// The base as it is before training: its codes and scales, and its full-precision tensors.
typedef struct {
    unsigned char *codes;
    size_t n_codes;
    float *params;
} base_bits;

static void base_bits_take(base_bits *b, const fixture *fx) {
    b->n_codes = snapshot(&fx->qb, &b->codes);
    size_t nb = fx->model.layout.total * sizeof(float);
    b->params = malloc(nb);
    memcpy(b->params, fx->model.params, nb);
}

// Checks the base still has every bit of b, and frees b.
static void base_bits_check(base_bits *b, const fixture *fx, const char *name) {
    unsigned char *after;
    CHECK(snapshot(&fx->qb, &after) == b->n_codes);
    CHECK_MSG(memcmp(b->codes, after, b->n_codes) == 0, "%s: a base code or scale changed", name);
    CHECK_MSG(memcmp(b->params, fx->model.params, fx->model.layout.total * sizeof(float)) == 0,
              "%s: a full-precision base tensor changed", name);
    free(after);
    free(b->codes);
    free(b->params);
}

// 10 AdamW steps on the adapters (as torch.optim.AdamW over PEFT's trainable parameters).
static void check_adamw_track(const char *base, const char *name, int double_quant) {
    fixture fx;
    if (load_fixture(&fx, base, name, double_quant)) { CHECK(0); free_fixture(&fx); return; }
    float *want = fixture_tensor(&fx.expected, "adamw_losses", NULL);
    base_bits before;
    base_bits_take(&before, &fx);
    double worst = fixture_adamw_track(&fx.model, fx.lora.params, fx.lora.grads, fx.lora.total, fx.inputs, fx.targets,
                                       fx.B, fx.T, want, 10, name);
    CHECK_MSG(worst < 1e-4, "%s adamw loss curve deviates by %.3g relative", name, worst);
    base_bits_check(&before, &fx, name);
    free(want);
    free_fixture(&fx);
}

TEST(gpt2_qlora_adamw_tracks_peft_bnb) { check_adamw_track("gpt2_fp32", "gpt2-nf4-dq", 1); }
TEST(llama_qlora_adamw_tracks_peft_bnb) { check_adamw_track("llama_fp32", "llama-nf4-dq", 1); }
TEST(llama_qlora_no_double_quant_adamw_tracks_peft_bnb) { check_adamw_track("llama_fp32", "llama-nf4", 0); }
TEST(llama_qdora_adamw_tracks_peft_bnb) { check_adamw_track("llama_fp32", "llama-nf4-dq-dora", 1); }

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

// ---- bf16 compute (bnb_4bit_compute_dtype=torch.bfloat16) ----------------------------------------------
// Against PEFT + bitsandbytes with compute dtype bfloat16 under torch.autocast("cpu", torch.bfloat16)
// (expected_bf16.safetensors). Both sides round activations and weights to bf16 at different points
// (torch rounds every op's output, shardlm stores its activations in bf16 and stages the other ops in
// fp32), so the bounds are the bf16 LoRA tests' (test_lora.c bf16_storage_tracks_fp32_with_adapters):
// loss within 2e-2 relative, adapter gradients within 5e-2 in relative L2; logits within 5e-2 of the
// largest. The 10 AdamW steps track PEFT + bitsandbytes' bf16 losses, and the fp32 QLoRA losses
// (expected.safetensors), within 2e-2 relative. Run on the table bf16 training picks here (oneDNN's on a
// CPU with bf16 instructions) and on the emulation (the fallback elsewhere).
#define BF16_LOSS_TOL 2e-2
#define BF16_GRAD_L2_TOL 5e-2
#define BF16_LOGITS_TOL 5e-2

static double rel_l2(const sl_st_file *f, const char *name, const float *got, size_t n) {
    size_t wn = 0;
    float *want = fixture_tensor(f, name, &wn);
    if (!want || wn != n) { free(want); return INFINITY; }
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        den += (double)want[i] * want[i];
    }
    free(want);
    return sqrt(num / fmax(den, 1e-60));
}

static void check_bf16_against_peft(const char *base, const char *name, const sl_ops *table) {
    fixture fx;
    if (load_fixture_on(&fx, base, name, 1, table)) { CHECK(0); free_fixture(&fx); return; }
    sl_model *m = &fx.model;
    CHECK(m->ops->act_bf16 == 1 && m->grads == NULL);
    sl_st_file bf;
    char path[256];
    snprintf(path, sizeof path, "tests/fixtures/qlora/%s/expected_bf16.safetensors", name);
    if (sl_st_open(&bf, path)) { fprintf(stderr, "  %s\n", sl_error()); CHECK(0); free_fixture(&fx); return; }
    float loss;
    CHECK(sl_model_forward(m, fx.inputs, fx.targets, fx.B, fx.T, &loss) == 0);
    size_t n = (size_t)fx.B * fx.T * (size_t)m->cfg.vocab_size;
    float *logits = malloc(n * sizeof(float)), *want_loss = fixture_tensor(&bf, "loss", NULL);
    CHECK(sl_model_logits(m, 0, fx.B * fx.T, logits) == 0);
    double rel = rel_error(&bf, "logits", logits, n), rel64 = rel_error(&fx.expected, "logits", logits, n);
    CHECK_MSG(rel < BF16_LOGITS_TOL, "%s bf16 logits %.3g from PEFT + bitsandbytes bf16", name, rel);
    CHECK_MSG(fabs(loss - want_loss[0]) <= BF16_LOSS_TOL * fabs(want_loss[0]), "%s bf16 loss %.6f, PEFT %.6f", name,
              loss, want_loss[0]);
    sl_model_zero_grad(m);
    CHECK(sl_model_backward(m, 1.0f) == 0);
    double worst = 0, worst64 = 0;
    for (int i = 0; i < fx.lora.n_tensors; i++) {
        const sl_tensor_info *t = &fx.lora.tensors[i];
        char g[200];
        snprintf(g, sizeof g, "grad.%s", t->name);
        worst = fmax(worst, rel_l2(&bf, g, fx.lora.grads + t->offset, t->numel));
        worst64 = fmax(worst64, rel_l2(&fx.expected, g, fx.lora.grads + t->offset, t->numel));
    }
    CHECK_MSG(worst < BF16_GRAD_L2_TOL, "%s bf16 adapter gradients rel L2 %.3g from PEFT bf16", name, worst);
    float *loss64 = fixture_tensor(&fx.expected, "loss", NULL);
    printf("  %s on %s: logits %.2e of the largest from PEFT + bnb bf16 (%.2e from float64); loss %.6f vs %.6f "
           "(float64 %.6f); worst adapter gradient rel L2 %.2e (%.2e from float64)\n", name, m->ops->name, rel, rel64,
           loss, want_loss[0], loss64 ? loss64[0] : NAN, worst, worst64);
    free(loss64);
    free(logits);
    free(want_loss);
    sl_st_close(&bf);
    free_fixture(&fx);
}

static const sl_ops *bf16_table(void) { return sl_ops_for_precision(&sl_ops_cpu, SL_PRECISION_BF16); }

TEST(gpt2_qlora_bf16_matches_peft_bnb_bf16) { check_bf16_against_peft("gpt2_fp32", "gpt2-nf4-dq", bf16_table()); }
TEST(llama_qlora_bf16_matches_peft_bnb_bf16) { check_bf16_against_peft("llama_fp32", "llama-nf4-dq", bf16_table()); }
TEST(gpt2_qlora_bf16_emulation_matches_peft_bnb_bf16) {
    check_bf16_against_peft("gpt2_fp32", "gpt2-nf4-dq", &sl_ops_cpu_bf16);
}
TEST(llama_qlora_bf16_emulation_matches_peft_bnb_bf16) {
    check_bf16_against_peft("llama_fp32", "llama-nf4-dq", &sl_ops_cpu_bf16);
}
TEST(llama_qdora_bf16_matches_peft_bnb_bf16) {
    check_bf16_against_peft("llama_fp32", "llama-nf4-dq-dora", bf16_table());
    check_bf16_against_peft("llama_fp32", "llama-nf4-dq-dora", &sl_ops_cpu_bf16);
}

// QDoRA with dropout: its second base GEMM runs on the dequantised rows. The gradient along a fixed
// direction against central differences of the loss, DoRA's norms held (no sl_lora_params_changed
// between the forwards, as PEFT detaches them), the dropout masks the same in every forward.
TEST(qdora_dropout_gradient_matches_differences) {
    fixture fx;
    if (load_fixture(&fx, "llama_fp32", "llama-nf4-dq-dora", 1)) { CHECK(0); free_fixture(&fx); return; }
    sl_model *m = &fx.model;
    fx.lora.cfg.lora_dropout = 0.25f;
    fx.lora.training = 1;
    fx.lora.dropout_seed = 7;
    size_t n = fx.lora.total;
    float loss, lp, lm, h = 1e-3f, *p0 = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
    memcpy(p0, fx.lora.params, n * sizeof(float));
    sl_model_zero_grad(m);
    CHECK(sl_model_forward(m, fx.inputs, fx.targets, fx.B, fx.T, &loss) == 0 && sl_model_backward(m, 1.0f) == 0);
    double d = 0;
    for (size_t i = 0; i < n; i++) {
        v[i] = (float)cos(0.9 * (double)i + 0.1);
        d += (double)fx.lora.grads[i] * v[i];
    }
    for (int sign = 1; sign >= -1; sign -= 2) {
        for (size_t i = 0; i < n; i++) fx.lora.params[i] = p0[i] + (float)sign * h * v[i];
        CHECK(sl_model_forward(m, fx.inputs, fx.targets, fx.B, fx.T, sign > 0 ? &lp : &lm) == 0);
    }
    double fd = ((double)lp - lm) / (2.0 * h), rel = fabs(fd - d) / fabs(d);
    CHECK_MSG(rel < 2e-3, "QDoRA dropout: directional derivative %.6g, differences %.6g (rel %.2g)", d, fd, rel);
    printf("  llama-nf4-dq-dora, dropout 0.25: directional derivative %.6f, central differences %.6f (rel %.1e)\n", d,
           fd, rel);
    free(p0);
    free(v);
    free_fixture(&fx);
}

// 10 AdamW steps in bf16: PEFT + bitsandbytes' bf16 curve and the fp32 QLoRA curve, each within 2e-2;
// the base's codes, scales and full-precision tensors keep every bit.
static void check_bf16_adamw(const char *base, const char *name) {
    fixture fx;
    if (load_fixture_on(&fx, base, name, 1, bf16_table())) { CHECK(0); free_fixture(&fx); return; }
    sl_st_file bf;
    char path[256];
    snprintf(path, sizeof path, "tests/fixtures/qlora/%s/expected_bf16.safetensors", name);
    if (sl_st_open(&bf, path)) { fprintf(stderr, "  %s\n", sl_error()); CHECK(0); free_fixture(&fx); return; }
    float *want = fixture_tensor(&bf, "adamw_losses", NULL), *want32 = fixture_tensor(&fx.expected, "adamw_losses", NULL);
    base_bits before;
    base_bits_take(&before, &fx);
    float *adapters = malloc(fx.lora.total * sizeof(float));
    memcpy(adapters, fx.lora.params, fx.lora.total * sizeof(float));
    double worst = fixture_adamw_track(&fx.model, fx.lora.params, fx.lora.grads, fx.lora.total, fx.inputs, fx.targets,
                                       fx.B, fx.T, want, 10, name);
    CHECK_MSG(worst < BF16_LOSS_TOL, "%s bf16 adamw curve %.3g from PEFT + bitsandbytes bf16", name, worst);
    // the same steps again from the same adapters against the fp32 QLoRA curve
    memcpy(fx.lora.params, adapters, fx.lora.total * sizeof(float));
    CHECK(sl_model_params_changed(&fx.model) == 0);
    double worst32 = fixture_adamw_track(&fx.model, fx.lora.params, fx.lora.grads, fx.lora.total, fx.inputs,
                                         fx.targets, fx.B, fx.T, want32, 10, name);
    CHECK_MSG(worst32 < BF16_LOSS_TOL, "%s bf16 adamw curve %.3g from fp32 QLoRA's", name, worst32);
    printf("  %s bf16 10 AdamW steps: worst %.2e from PEFT + bnb bf16, %.2e from fp32 QLoRA\n", name, worst, worst32);
    base_bits_check(&before, &fx, name);
    free(adapters);
    free(want);
    free(want32);
    sl_st_close(&bf);
    free_fixture(&fx);
}

TEST(gpt2_qlora_bf16_adamw_tracks_peft_bnb_and_fp32) { check_bf16_adamw("gpt2_fp32", "gpt2-nf4-dq"); }
TEST(llama_qlora_bf16_adamw_tracks_peft_bnb_and_fp32) { check_bf16_adamw("llama_fp32", "llama-nf4-dq"); }

// An NF4 base of tests/fixtures/quant/NAME on the fp32 CPU table, not installed; its linears' registry
// entries (at most 64), keyed by the fp32 parameter addresses, into e. Returns how many.
static int nf4_base_linears(const char *name, sl_model *m, sl_quant_base *qb, sl_quant_ops_entry *e) {
    char dir[160];
    snprintf(dir, sizeof dir, "tests/fixtures/quant/%s", name);
    sl_model_source src;
    CHECK(sl_model_source_resolve(&src, dir) == 0);
    sl_quant_config qc;
    CHECK(sl_quant_config_from_flag("nf4", &qc) == 0);
    CHECK(sl_quant_base_create(qb, m, &src, &qc, &sl_ops_cpu, 0) == 0);
    int ne = 0;
    CHECK(sl_quant_model_linears(&qb->qm, &m->layout, m->params, e, &ne) == 0);
    return ne;
}

// A tile of rows at a time (5 rows: q|k|v's parts cut mid-tile) equals one tile over the whole weight in
// bf16 compute, on both GEMM paths, within fp32 rounding of the sums (1e-6 of the largest output, 1e-5 of
// the largest input gradient, which sums over the tiles).
TEST(bf16_tiles_equal_one_tile) {
    sl_model m;
    sl_quant_base qb;
    sl_quant_ops_entry e[64];
    CHECK(nf4_base_linears("llama_fp32", &m, &qb, e) > 0);
    sl_qlinear whole = e[0].lin, tiled = e[0].lin;   // q|k|v: three parts
    whole.tile_floats = (size_t)whole.out_features * (size_t)whole.in_features;
    tiled.tile_floats = 5 * (size_t)tiled.in_features;   // 5 rows a tile: parts cut mid-tile
    const int N = 7, IC = (int)whole.in_features, OC = (int)whole.out_features;
    for (int native = 0; native <= 1; native++) {
        if (native && bf16_table() != &sl_ops_cpu_bf16_native) continue;
        sl_qlinear *ls[2] = {&whole, &tiled};
        float *out32[2], *din32[2];
        for (int k = 0; k < 2; k++) {
            sl_qlinear *l = ls[k];
            l->scratch = malloc(sl_qlinear_tile_floats(l) * sizeof(float));
            l->scratch_bf16 = malloc(sl_qlinear_bf16_tile_values(l) * sizeof(sl_bf16));
            float *work = malloc(sl_qlinear_bf16_work_floats(l, N, native) * sizeof(float));
            sl_bf16 *x = malloc(sizeof(sl_bf16) * N * (OC > IC ? OC : IC)), *din = malloc(sizeof(sl_bf16) * N * IC);
            for (int i = 0; i < N * (OC > IC ? OC : IC); i++) x[i] = sl_f32_to_bf16(0.05f * (float)((i * 37) % 23 - 11));
            out32[k] = malloc(sizeof(float) * N * OC);
            din32[k] = malloc(sizeof(float) * N * IC);
            CHECK(sl_qlinear_forward_bf16(l, out32[k], 1, x, NULL, N, work, native) == 0);
            CHECK(sl_qlinear_backward_input_bf16(l, din, x, N, work, native) == 0);
            sl_bf16_to_f32_array(din, din32[k], (size_t)N * IC);
            free(l->scratch);
            free(l->scratch_bf16);
            free(work);
            free(x);
            free(din);
        }
        double dmax = 0, dref = 0;
        for (int i = 0; i < N * IC; i++) {
            dmax = fmax(dmax, fabs(din32[0][i] - din32[1][i]));
            dref = fmax(dref, fabs(din32[0][i]));
        }
        double omax = 0, oref = 0;
        for (int i = 0; i < N * OC; i++) {
            omax = fmax(omax, fabs(out32[0][i] - out32[1][i]));
            oref = fmax(oref, fabs(out32[0][i]));
        }
        CHECK_MSG(omax <= 1e-6 * oref && dmax <= 1e-5 * dref, "%s: forward %.3g, dinp %.3g (of %.3g)",
                  native ? "oneDNN" : "portable", omax, dmax, dref);
        printf("  bf16 tiles (%s): forward max diff %.2e, dinp %.2e of %.2e\n", native ? "oneDNN" : "portable", omax,
               dmax, dref);
        for (int k = 0; k < 2; k++) { free(out32[k]); free(din32[k]); }
    }
    sl_model_free(&m);
    sl_quant_base_free(&qb);
}

// matmul_backward_gelu on a registered quantised weight (GPT-2's c_proj) gives the bits of matmul_backward
// then gelu_backward on every quantised table: the bf16 tables are copies of tables whose own entry would
// read the registry's key as a bf16 weight. The entries are keyed by fp32 parameter addresses here; the
// tables only look a registered weight up, never read it.
TEST(quantised_tables_backward_gelu_is_backward_then_gelu) {
    sl_model m;
    sl_quant_base qb;
    sl_quant_ops_entry e[64];
    int ne = nf4_base_linears("gpt2_fp32", &m, &qb, e);
    const sl_quant_ops_entry *down = NULL;  // the first linear whose input is wider than its output
    for (int i = 0; i < ne && !down; i++)
        if (e[i].lin.in_features > e[i].lin.out_features) down = &e[i];
    CHECK(down != NULL && sl_quant_ops_install(e, ne) == 0);
    const sl_ops *tables[3] = {&sl_ops_cpu_quant, sl_quant_ops_for(&sl_ops_cpu_bf16), sl_quant_ops_for(bf16_table())};
    const int N = 5, IC = (int)down->lin.in_features, OC = (int)down->lin.out_features;
    for (int k = 0; k < 3 && down; k++) {
        const sl_ops *t = tables[k];
        const size_t es = t->act_bf16 ? sizeof(sl_bf16) : sizeof(float);
        char *dout = malloc(es * N * OC), *inp = malloc(es * N * IC), *pre = malloc(es * N * IC);
        char *d1 = malloc(es * N * IC), *d2 = malloc(es * N * IC);
        float db1[64] = {0}, db2[64] = {0};
        float *db_1 = OC <= 64 ? db1 : NULL, *db_2 = OC <= 64 ? db2 : NULL;
        for (int i = 0; i < N * (OC > IC ? OC : IC); i++) {
            float v = 0.03f * (float)((i * 29) % 31 - 15);
            if (i < N * OC) { if (t->act_bf16) ((sl_bf16 *)dout)[i] = sl_f32_to_bf16(v); else ((float *)dout)[i] = v; }
            if (i < N * IC) {
                float u = 0.05f * (float)((i * 13) % 17 - 8);
                if (t->act_bf16) { ((sl_bf16 *)inp)[i] = sl_f32_to_bf16(u); ((sl_bf16 *)pre)[i] = sl_f32_to_bf16(v); }
                else { ((float *)inp)[i] = u; ((float *)pre)[i] = v; }
            }
        }
        const sl_act *w = (const sl_act *)down->weight;
        t->matmul_backward_gelu((sl_act *)d1, NULL, db_1, (const sl_act *)dout, (const sl_act *)inp, w, (const sl_act *)pre,
                                N, IC, OC);
        t->matmul_backward((sl_act *)d2, NULL, db_2, (const sl_act *)dout, (const sl_act *)inp, w, N, IC, OC);
        t->gelu_backward((sl_act *)d2, (const sl_act *)pre, (const sl_act *)d2, (size_t)N * IC);
        CHECK(t->synchronize() == 0);
        CHECK_MSG(memcmp(d1, d2, es * N * IC) == 0 && memcmp(db1, db2, sizeof db1) == 0, "%s: bits differ", t->name);
        free(dout); free(inp); free(pre); free(d1); free(d2);
    }
    sl_quant_ops_install(NULL, 0);
    sl_model_free(&m);
    sl_quant_base_free(&qb);
}

// bnb_4bit_compute_dtype: "bfloat16" is read (bf16 training computes in it), "float16" refused by name.
TEST(compute_dtype_words) {
    const char *words[2] = {"bfloat16", "float16"};
    for (int i = 0; i < 2; i++) {
        char js[160];
        snprintf(js, sizeof js, "{\"load_in_4bit\": true, \"bnb_4bit_quant_type\": \"nf4\", \"bnb_4bit_compute_dtype\": \"%s\"}",
                 words[i]);
        cJSON *o = cJSON_Parse(js);
        sl_quant_config qc;
        int rc = sl_quant_config_parse(o, &qc, "cfg.json: quantization_config");
        if (i == 0) CHECK_MSG(rc == 0 && qc.compute_dtype == SL_QDT_BF16 && qc.type == SL_QUANT_NF4, "%s", sl_error());
        else CHECK_MSG(rc != 0 && strstr(sl_error(), "bnb_4bit_compute_dtype \"float16\""), "message: %s", sl_error());
        cJSON_Delete(o);
    }
}

TEST(quantised_base_refuses_other_tables) {
    sl_model_source src;
    CHECK(sl_model_source_resolve(&src, "tests/fixtures/quant/llama_fp32") == 0);
    sl_quant_config qc;
    CHECK(sl_quant_config_from_flag("int8", &qc) == 0);
    sl_model m;
    sl_quant_base qb;
    CHECK(sl_quant_base_create(&qb, &m, &src, &qc, &sl_ops_cpu_quant, 0) != 0);
    CHECK_MSG(strstr(sl_error(), "the cpu-quant ops table cannot run it") != NULL, "message: %s", sl_error());
}

TEST_MAIN()
