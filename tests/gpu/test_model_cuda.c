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
// WMMA kernels of attention_tc.cu).
// Usage: test_model_cuda [DEVICE]   (default cuda:0). Prints PASS/FAIL lines, "N passed, N failed".
#include "shardlm/engine.h"
#include "shardlm/error.h"
#include "shardlm/precision.h"
#include "shardlm/settings.h"

#include <math.h>
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

// 5 AdamW steps through the engine; returns the final weights on the host.
static float *train5(const sl_model_config *cfg, const sl_ops *ops, const int *in, const int *tg, int B, int T) {
    sl_model m;
    if (sl_model_create(&m, cfg, ops) || sl_model_init_weights(&m, 5)) return NULL;
    sl_engine_config ec = {.micro_batch = B, .grad_accum_steps = 1, .gradient_clipping = 1.0f};
    sl_optim_defaults(&ec.optim);
    ec.optim.lr = 1e-3;
    ec.optim.weight_decay = 0.1;
    sl_schedule_constant(&ec.schedule, ec.optim.lr);
    sl_loss_scaler_defaults(&ec.precision);
    sl_engine e;
    if (sl_engine_init(&e, &m, &ec)) return NULL;
    for (int s = 0; s < 5; s++)
        if (sl_engine_forward_backward(&e, in, tg, B, T, NULL) || sl_engine_step(&e)) return NULL;
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
    return gpu_finish(gpu);
}
