// test_model.c: a tiny GPT-2 and a tiny LLaMA against transformers (fixtures from
// tests/reference/make_model_fixtures.py): logits, loss and every parameter gradient within 1e-5
// relative (per tensor: max |ours - theirs| / max |theirs|), and 10 AdamW steps tracking
// PyTorch's losses. Also: gradient accumulation equals one bigger batch, the fused ops (GEMM + GELU,
// residual + norm, the fused classifier) change no bit of the model, every forward/backward tells the backend the model's
// precision, and the model rejects out-of-range tokens and over-long sequences with a clear message.
#include "test.h"
#include "test_fixture.h"

#include "shardlm/engine.h"
#include "shardlm/error.h"
#include "shardlm/settings.h"
#include "shardlm/hf_weights.h"
#include "shardlm/model.h"
#include "shardlm/precision.h"
#include "shardlm/safetensors.h"

#define REL_TOL 1e-5

typedef struct {
    sl_model model;
    sl_st_file expected;
    int *inputs, *targets;
    int B, T;
} fixture;

static int load_fixture(fixture *fx, const char *name) {
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fixtures/model/%s", name);
    sl_model_config cfg;
    if (fixture_model(dir, &fx->model, &cfg)) return -1;
    return fixture_expected(dir, &fx->expected, &fx->inputs, &fx->targets, &fx->B, &fx->T);
}

static void free_fixture(fixture *fx) {
    sl_model_free(&fx->model);
    sl_st_close(&fx->expected);
    free(fx->inputs);
    free(fx->targets);
}

// Our gradient of tensor t in Hugging Face's layout (transposed for Conv1D, padding rows dropped).
static float *grad_in_hf_layout(const sl_model *m, const sl_tensor_info *t) {
    size_t rows = (size_t)t->hf_rows, cols = (size_t)t->shape[1];
    float *out = malloc(sizeof(float) * rows * cols);
    const float *g = m->grads + t->offset;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) {
            if (t->hf_transposed) out[c * rows + r] = g[r * cols + c];
            else out[r * cols + c] = g[r * cols + c];
        }
    return out;
}

static void check_against_transformers(const char *name) {
    fixture fx;
    memset(&fx, 0, sizeof fx);
    if (load_fixture(&fx, name)) { CHECK(0); return; }
    sl_model *m = &fx.model;
    float loss;
    CHECK(sl_model_forward(m, fx.inputs, fx.targets, fx.B, fx.T, &loss) == 0);
    size_t n = 0;
    float *want_logits = fixture_tensor(&fx.expected, "logits", &n), *want_loss = fixture_tensor(&fx.expected, "loss", NULL);
    int V = m->cfg.vocab_size;
    float *logits = malloc((size_t)fx.B * fx.T * V * sizeof(float));
    CHECK(sl_model_logits(m, 0, fx.B * fx.T, logits) == 0);
    double worst = 0;
    for (size_t i = 0; i < (size_t)fx.B * fx.T * V; i++) worst = fmax(worst, fabs(logits[i] - want_logits[i]));
    free(logits);
    double rel = worst / fixture_max_abs(want_logits, n);
    CHECK_MSG(rel < REL_TOL, "%s logits relative error %.3g", name, rel);
    CHECK_MSG(fabs(loss - want_loss[0]) <= REL_TOL * fabs(want_loss[0]), "%s loss %.8f vs %.8f", name, loss, want_loss[0]);

    sl_model_zero_grad(m);
    CHECK(sl_model_backward(m, 1.0f) == 0);
    double worst_rel = 0;
    const char *worst_name = "";
    for (int i = 0; i < m->layout.n_tensors; i++) {
        const sl_tensor_info *t = &m->layout.tensors[i];
        char gname[128];
        snprintf(gname, sizeof gname, "grad.%s", t->name);
        size_t gn = 0;
        float *want = fixture_tensor(&fx.expected, gname, &gn);
        if (!want) { CHECK_MSG(0, "missing %s", gname); continue; }
        float *got = grad_in_hf_layout(m, t);
        CHECK_MSG(gn == (size_t)t->hf_rows * t->shape[1], "%s numel", gname);
        double w = 0;
        for (size_t j = 0; j < gn; j++) w = fmax(w, fabs(got[j] - want[j]));
        double r = w / fmax(fixture_max_abs(want, gn), 1e-30);
        if (r > worst_rel) { worst_rel = r; worst_name = t->name; }
        free(want);
        free(got);
    }
    CHECK_MSG(worst_rel < REL_TOL, "%s worst gradient relative error %.3g in %s", name, worst_rel, worst_name);
    printf("  %s: logits rel err %.2e, loss %.7f vs %.7f, worst grad rel err %.2e (%s)\n", name, rel, loss,
           want_loss[0], worst_rel, worst_name);
    free(want_logits);
    free(want_loss);
    free_fixture(&fx);
}

TEST(gpt2_tiny_matches_transformers) { check_against_transformers("gpt2-tiny"); }
TEST(llama_tiny_matches_transformers) { check_against_transformers("llama-tiny"); }

// 10 AdamW steps (lr 1e-2, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on linear weights only) on
// the fixture batch; the fixture holds PyTorch's loss before each step.
static void check_adamw_track(const char *name) {
    fixture fx;
    memset(&fx, 0, sizeof fx);
    if (load_fixture(&fx, name)) { CHECK(0); return; }
    float *want = fixture_tensor(&fx.expected, "adamw_losses", NULL);
    sl_engine_config ec = {.micro_batch = fx.B, .grad_accum_steps = 1, .gradient_clipping = 0.0f};
    sl_optim_defaults(&ec.optim);
    ec.optim.lr = 1e-2f;
    ec.optim.beta1 = 0.9f;
    ec.optim.beta2 = 0.95f;
    ec.optim.eps = 1e-8f;
    ec.optim.weight_decay = 0.1f;
    sl_schedule_constant(&ec.schedule, ec.optim.lr);
    sl_engine e;
    CHECK(sl_engine_init(&e, &fx.model, &ec) == 0);
    double worst = 0;
    for (int s = 0; s < 10; s++) {
        float loss;
        CHECK(sl_engine_forward_backward(&e, fx.inputs, fx.targets, fx.B, fx.T, &loss) == 0);
        CHECK(sl_engine_step(&e) == 0);
        worst = fmax(worst, fabs(loss - want[s]) / fabs(want[s]));
        if (s == 0 || s == 9) printf("  %s step %d: loss %.6f, pytorch %.6f\n", name, s + 1, loss, want[s]);
    }
    // fp32 round-off compounds through 10 large-lr steps; 1e-4 relative is far below any real bug
    CHECK_MSG(worst < 1e-4, "%s adamw loss curve deviates by %.3g relative", name, worst);
    sl_engine_free(&e);
    free(want);
    free_fixture(&fx);
}

TEST(gpt2_tiny_adamw_tracks_pytorch) { check_adamw_track("gpt2-tiny"); }
TEST(llama_tiny_adamw_tracks_pytorch) { check_adamw_track("llama-tiny"); }

// Two micro-batches of B=1 with accumulation give the gradient of one batch of B=2 (same tokens).
TEST(gradient_accumulation_matches_bigger_batch) {
    const char *presets[2] = {"gpt2-tiny", "llama-tiny"};
    for (int p = 0; p < 2; p++) {
        sl_model_config cfg;
        CHECK(sl_config_preset(&cfg, presets[p]) == 0);
        sl_model a, b;
        CHECK(sl_model_create(&a, &cfg, &sl_ops_cpu) == 0);
        CHECK(sl_model_create(&b, &cfg, &sl_ops_cpu) == 0);
        sl_model_init_weights(&a, 7);
        sl_model_init_weights(&b, 7);
        int T = 16, in[32], tg[32];
        for (int i = 0; i < 32; i++) { in[i] = (i * 37 + 11) % cfg.vocab_size; tg[i] = (i * 53 + 5) % cfg.vocab_size; }
        CHECK(sl_model_forward(&a, in, tg, 2, T, NULL) == 0);
        CHECK(sl_model_backward(&a, 1.0f) == 0);
        for (int k = 0; k < 2; k++) {
            CHECK(sl_model_forward(&b, in + k * T, tg + k * T, 1, T, NULL) == 0);
            CHECK(sl_model_backward(&b, 0.5f) == 0);
        }
        double w = 0, mx = 0;
        for (size_t i = 0; i < a.layout.total; i++) {
            w = fmax(w, fabs(a.grads[i] - b.grads[i]));
            mx = fmax(mx, fabs(a.grads[i]));
        }
        CHECK_MSG(w / mx < 1e-5, "%s accumulation rel err %.3g", presets[p], w / mx);
        sl_model_free(&a);
        sl_model_free(&b);
    }
}

TEST(bad_tokens_and_lengths_are_rejected) {
    sl_model_config cfg;
    CHECK(sl_config_preset(&cfg, "gpt2-tiny") == 0);
    sl_model m;
    CHECK(sl_model_create(&m, &cfg, &sl_ops_cpu) == 0);
    int in[4] = {1, 2, 100, 3}, tg[4] = {1, 2, 3, 4};
    CHECK(sl_model_forward(&m, in, tg, 1, 4, NULL) == -1);
    CHECK(strstr(sl_error(), "outside the vocabulary") != NULL);
    int *big = calloc(65, sizeof(int));
    CHECK(sl_model_forward(&m, big, NULL, 1, 65, NULL) == -1);
    CHECK(strstr(sl_error(), "exceeds") != NULL);
    CHECK(sl_model_backward(&m, 1.0f) == -1);
    free(big);
    sl_model_free(&m);
}

// ---- the fused ops, seen from the model -------------------------------------------------------

// A CPU table whose fused entries run the separate ops one after another (what the model did before
// the fused ops existed), and which records what set_precision was told.
static int told_precision = -1, precision_calls;
static void unfused_matmul_gelu_forward(sl_act *out, sl_act *pre, const sl_act *inp, const sl_act *w, const sl_act *b,
                                        int N, int IC, int OC) {
    sl_ops_cpu.matmul_forward(pre, inp, w, b, N, IC, OC);
    sl_ops_cpu.gelu_forward(out, pre, (size_t)N * OC);
}
static void unfused_matmul_gelu_backward(sl_act *dinp, float *dw, float *db, sl_act *dout, const sl_act *pre,
                                         const sl_act *inp, const sl_act *w, int N, int IC, int OC) {
    float *dpre = malloc(sizeof(float) * (size_t)N * OC);
    sl_ops_cpu.gelu_backward(ACT(dpre), pre, dout, (size_t)N * OC);
    sl_ops_cpu.matmul_backward(dinp, dw, db, ACT(dpre), inp, w, N, IC, OC);
    memcpy(dout, dpre, sizeof(float) * (size_t)N * OC);
    free(dpre);
}
static void unfused_matmul_backward_gelu(sl_act *dinp, float *dw, float *db, const sl_act *dout, const sl_act *inp,
                                         const sl_act *w, const sl_act *pre, int N, int IC, int OC) {
    float *dact = malloc(sizeof(float) * (size_t)N * IC);
    sl_ops_cpu.matmul_backward(dinp ? ACT(dact) : NULL, dw, db, dout, inp, w, N, IC, OC);
    if (dinp) sl_ops_cpu.gelu_backward(dinp, pre, ACT(dact), (size_t)N * IC);
    free(dact);
}
static void unfused_residual_layernorm(sl_act *resid, sl_act *out, float *mean, float *rstd, const sl_act *a,
                                       const sl_act *b, const sl_act *w, const sl_act *bias, int N, int C, float eps) {
    sl_ops_cpu.residual_forward(resid, a, b, (size_t)N * C);
    sl_ops_cpu.layernorm_forward(out, mean, rstd, resid, w, bias, N, C, eps);
}
static void unfused_residual_rmsnorm(sl_act *resid, sl_act *out, float *rstd, const sl_act *a, const sl_act *b,
                                     const sl_act *w, int N, int C, float eps) {
    sl_ops_cpu.residual_forward(resid, a, b, (size_t)N * C);
    sl_ops_cpu.rmsnorm_forward(out, rstd, resid, w, N, C, eps);
}
static void record_precision(int precision) {
    told_precision = precision;
    precision_calls++;
}

// Models a (on the CPU table) and b (on ops_b) of a preset, with the same weights.
static void model_pair(const char *preset, const sl_ops *ops_b, uint64_t seed, sl_model_config *cfg, sl_model *a,
                       sl_model *b) {
    CHECK(sl_config_preset(cfg, preset) == 0);
    CHECK(sl_model_create(a, cfg, &sl_ops_cpu) == 0);
    CHECK(sl_model_create(b, cfg, ops_b) == 0);
    sl_model_init_weights(a, seed);
    sl_model_init_weights(b, seed);
}

// The model on the CPU table and on the unfused one: identical logits, loss and gradients (bits).
TEST(fused_ops_change_no_bit_of_the_model) {
    sl_ops unfused = sl_ops_cpu;
    unfused.matmul_gelu_forward = unfused_matmul_gelu_forward;
    unfused.matmul_gelu_backward = unfused_matmul_gelu_backward;
    unfused.matmul_backward_gelu = unfused_matmul_backward_gelu;
    unfused.residual_layernorm_forward = unfused_residual_layernorm;
    unfused.residual_rmsnorm_forward = unfused_residual_rmsnorm;
    const char *presets[2] = {"gpt2-tiny", "llama-tiny"};
    for (int p = 0; p < 2; p++) {
        sl_model_config cfg;
        sl_model a, b;
        model_pair(presets[p], &unfused, 3, &cfg, &a, &b);
        int B = 2, T = 16, in[32], tg[32];
        for (int i = 0; i < 32; i++) { in[i] = (i * 29 + 3) % cfg.vocab_size; tg[i] = (i * 41 + 7) % cfg.vocab_size; }
        float la = 0, lb = 0;
        CHECK(sl_model_forward(&a, in, tg, B, T, &la) == 0 && sl_model_forward(&b, in, tg, B, T, &lb) == 0);
        size_t nl = (size_t)B * T * cfg.padded_vocab_size;
        CHECK_MSG(la == lb && !memcmp(a.logits, b.logits, sizeof(float) * nl), "%s: forward differs", presets[p]);
        CHECK(sl_model_backward(&a, 1.0f) == 0 && sl_model_backward(&b, 1.0f) == 0);
        CHECK_MSG(!memcmp(a.grads, b.grads, sizeof(float) * a.layout.total), "%s: gradients differ", presets[p]);
        sl_model_free(&a);
        sl_model_free(&b);
    }
}

// GPT-2's MLP backward: matmul_backward_gelu then matmul_backward (default), or matmul_backward then
// matmul_gelu_backward (SHARDLM_FUSED_KERNELS=0): the same gradients, bit for bit, on the CPU.
TEST(gpt2_mlp_backward_paths_give_the_same_bits) {
    sl_model_config cfg;
    sl_model a, b;
    model_pair("gpt2-tiny", &sl_ops_cpu, 5, &cfg, &a, &b);
    int B = 2, T = 16, in[32], tg[32];
    for (int i = 0; i < 32; i++) { in[i] = (i * 31 + 5) % cfg.vocab_size; tg[i] = (i * 43 + 1) % cfg.vocab_size; }
    float la = 0, lb = 0;
    CHECK(sl_model_forward(&a, in, tg, B, T, &la) == 0 && sl_model_forward(&b, in, tg, B, T, &lb) == 0);
    CHECK(sl_model_backward(&a, 1.0f) == 0);
    setenv("SHARDLM_FUSED_KERNELS", "0", 1);
    CHECK(sl_settings_load() == 0);
    CHECK(sl_model_backward(&b, 1.0f) == 0);
    unsetenv("SHARDLM_FUSED_KERNELS");
    CHECK(sl_settings_load() == 0);
    CHECK_MSG(!memcmp(a.grads, b.grads, sizeof(float) * a.layout.total), "the two MLP backward paths differ");
    sl_model_free(&a);
    sl_model_free(&b);
}

// The fused classifier (sl_model_expect_backward): the loss and dlogits in forward through
// crossentropy_fused give the separate ops' loss and gradients bit for bit; its logits are not
// readable, a backward with another grad_scale is refused, and the announcement holds one forward.
static int fused_ce_calls;
static double counting_crossentropy_fused(float *lse, sl_act *logits, const int *targets, int N, int V, int Vp,
                                          float dloss) {
    fused_ce_calls++;
    return sl_ops_cpu.crossentropy_fused(lse, logits, targets, N, V, Vp, dloss);
}

TEST(fused_classifier_changes_no_bit_and_is_checked) {
    sl_ops counting = sl_ops_cpu;
    counting.crossentropy_fused = counting_crossentropy_fused;
    const char *presets[2] = {"gpt2-tiny", "llama-tiny"};
    for (int p = 0; p < 2; p++) {
        sl_model_config cfg;
        sl_model a, b;
        model_pair(presets[p], &counting, 4, &cfg, &a, &b);
        int B = 2, T = 16, in[32], tg[32];
        for (int i = 0; i < 32; i++) { in[i] = (i * 31 + 5) % cfg.vocab_size; tg[i] = i % 7 ? (i * 43 + 1) % cfg.vocab_size : -1; }
        float la = 0, lb = 0, *row = malloc(sizeof(float) * (size_t)cfg.vocab_size);
        fused_ce_calls = 0;
        sl_model_expect_backward(&b, 0.5f);
        CHECK(sl_model_forward(&a, in, tg, B, T, &la) == 0 && sl_model_forward(&b, in, tg, B, T, &lb) == 0);
        CHECK_MSG(fused_ce_calls == 1 && la == lb, "%s: %d fused calls, loss %.9g vs %.9g", presets[p], fused_ce_calls,
                  (double)lb, (double)la);
        CHECK(sl_model_logits(&b, 0, 1, row) == -1);
        CHECK(sl_model_backward(&a, 0.5f) == 0 && sl_model_backward(&b, 0.5f) == 0);
        CHECK_MSG(!memcmp(a.grads, b.grads, sizeof(float) * a.layout.total), "%s: gradients differ", presets[p]);
        sl_model_expect_backward(&b, 0.5f);
        CHECK(sl_model_forward(&b, in, tg, B, T, NULL) == 0);
        CHECK(sl_model_backward(&b, 1.0f) == -1 && strstr(sl_error(), "grad_scale") != NULL);
        sl_model_expect_backward(&b, 0.5f);
        CHECK(sl_model_forward(&b, in, NULL, B, T, NULL) == 0);  // no targets: the announcement is spent
        fused_ce_calls = 0;
        CHECK(sl_model_forward(&b, in, tg, B, T, NULL) == 0 && fused_ce_calls == 0);
        CHECK(sl_model_logits(&b, 0, 1, row) == 0);  // the separate forward keeps the logits
        free(row);
        sl_model_free(&a);
        sl_model_free(&b);
    }
}

// Every forward and backward hands the model's precision to the backend (fp32 unless set).
TEST(model_tells_the_backend_its_precision) {
    sl_ops ops = sl_ops_cpu;
    ops.set_precision = record_precision;
    sl_model_config cfg;
    CHECK(sl_config_preset(&cfg, "gpt2-tiny") == 0);
    sl_model m;
    CHECK(sl_model_create(&m, &cfg, &ops) == 0);
    sl_model_init_weights(&m, 1);
    CHECK(m.precision == SL_PRECISION_FP32);
    int in[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    precision_calls = 0;
    CHECK(sl_model_forward(&m, in, in, 1, 8, NULL) == 0);
    CHECK(precision_calls == 1 && told_precision == SL_PRECISION_FP32);
    m.precision = SL_PRECISION_BF16;
    CHECK(sl_model_backward(&m, 1.0f) == 0);
    CHECK(precision_calls == 2 && told_precision == SL_PRECISION_BF16);
    m.precision = SL_PRECISION_FP16;
    CHECK(sl_model_forward(&m, in, NULL, 1, 8, NULL) == 0);
    CHECK(precision_calls == 3 && told_precision == SL_PRECISION_FP16);
    sl_model_free(&m);
}

TEST(layout_counts_match_hugging_face) {
    // GPT2LMHeadModel(...).num_parameters() for the four published GPT-2 sizes
    const char *names[4] = {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"};
    const size_t counts[4] = {124439808, 354823168, 774030080, 1557611200};
    for (int i = 0; i < 4; i++) {
        sl_model_config cfg;
        sl_param_layout L;
        CHECK(sl_config_preset(&cfg, names[i]) == 0);
        CHECK(sl_layout_build(&L, &cfg) == 0);
        CHECK_MSG(sl_layout_num_parameters(&L) == counts[i], "%s: %zu parameters", names[i], sl_layout_num_parameters(&L));
        CHECK(cfg.padded_vocab_size == 50304);
        // blocks are contiguous, in order, and tile the buffer between embeddings and final norm
        for (int l = 0; l < cfg.n_layer; l++) CHECK(L.tensors[L.blocks[l].ln1_w].offset == L.block_begin[l]);
        CHECK(L.tensors[L.lnf_w].offset == L.block_begin[cfg.n_layer]);
        sl_layout_free(&L);
    }
}

TEST_MAIN()
