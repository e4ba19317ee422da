// test_generate_cuda.c: decoding on the GPU (part of tests/gpu/suite.sh). The model's cached forward
// (model.c: prefill from position 0, then one token at a time against the KV cache) runs unchanged on
// the CUDA table: the cache lives in device memory (ops->alloc), each step appends its keys and
// values with ops->copy and attends with the CUDA attention_decode kernel, and only the last row of
// logits comes back to the host. For gpt2-tiny and llama-tiny (GQA, RoPE) with the same weights:
//   - fp32: a greedy continuation of a 5-token prompt, teacher-forced with the CPU's tokens: at every
//     step the GPU's logits are within 2e-5 of the CPU's (relative to the largest; the CPU decodes
//     through its GEMV, itself within 1e-5 of its sgemm, the GPU through cuBLASLt) and its argmax is
//     the CPU's, unless the CPU's best two logits are within that bound of each other (a tie, counted
//     and printed); then sl_generate itself on both backends, greedy: the same tokens when no step
//     was a tie. Two GPU runs give the same bits (a cache reset in between).
//   - bf16 activation storage (cuda-bf16) against the CPU's emulation of it: teacher-forced logits
//     within 5e-2 (test_model_cuda's bound for bf16-storage logits) at every step.
//   - LoRA (gpu_check.h's test adapters on every linear, attached as `generate --adapter` attaches
//     them): fp32 and bf16 storage, the same bounds; the adapters must move the CPU's logits (else
//     the comparison would not see a GPU that ignores them).
// Usage: test_generate_cuda [DEVICE]   (default cuda:0). Prints PASS/FAIL lines, "N passed, N failed".
#include "shardlm/error.h"
#include "shardlm/generate.h"
#include "shardlm/kv_cache.h"
#include "shardlm/precision.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"

#define N_PROMPT 5
#define N_NEW 24
#define FP32_TOL 2e-5
#define BF16_TOL 5e-2


// The index of the largest of x[0..n) (the first on equality: sl_sample's greedy choice) and the gap
// to the second largest, relative to the largest magnitude.
static int argmax(const float *x, int n, double *gap) {
    int best = 0;
    double mx = 0;
    for (int i = 0; i < n; i++) {
        if (x[i] > x[best]) best = i;
        mx = fmax(mx, fabs((double)x[i]));
    }
    double second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != best && x[i] > second) second = x[i];
    *gap = mx > 0 ? ((double)x[best] - second) / mx : 0;
    return best;
}

// A model of `preset` on ops with weights from seed 13 (bf16 copies made where the table stores bf16);
// lo non-NULL: with the test adapters attached first (lo owned by the caller).
static int make_model(sl_model *m, const sl_model_config *cfg, const sl_ops *ops, sl_lora *lo) {
    if (sl_model_create(m, cfg, ops)) return -1;
    if (sl_model_init_weights(m, 13) || (lo && attach_test_lora(m, lo, 0.0f)) || sl_model_params_changed(m) ||
        sl_model_for_inference(m)) {
        sl_model_free(m);
        return -1;
    }
    return 0;
}

// Teacher-forced decoding on both models: the prompt, then N_NEW steps each feeding the reference's
// greedy token. Returns the worst logits difference; *mismatches counts steps whose argmax differs
// where the reference has no tie, *ties the steps it has one; tokens (N_NEW) gets the reference's.
static double decode_pair(sl_model *ref, sl_model *gpu, const int *prompt, double tol, int *mismatches, int *ties,
                          int *tokens, int *ok) {
    sl_kv_cache kr, kg;
    memset(&kr, 0, sizeof kr);
    memset(&kg, 0, sizeof kg);
    double worst = 0;
    *mismatches = *ties = 0;
    *ok = !sl_kv_cache_init(&kr, ref, N_PROMPT + N_NEW) && !sl_kv_cache_init(&kg, gpu, N_PROMPT + N_NEW);
    const float *lr = NULL, *lg = NULL;
    *ok = *ok && !sl_model_forward_cached(ref, &kr, prompt, N_PROMPT, &lr) &&
          !sl_model_forward_cached(gpu, &kg, prompt, N_PROMPT, &lg);
    int V = ref->cfg.vocab_size;
    for (int i = 0; *ok && i < N_NEW; i++) {
        worst = fmax(worst, rel_diff(lg, lr, V));
        double gap_r, gap_g;
        int tr = argmax(lr, V, &gap_r), tg = argmax(lg, V, &gap_g);
        if (gap_r <= tol) (*ties)++;
        else if (tr != tg) (*mismatches)++;
        tokens[i] = tr;
        if (i + 1 < N_NEW) *ok = !sl_kv_cache_forward(&kr, tr, &lr) && !sl_kv_cache_forward(&kg, tr, &lg);
    }
    if (!*ok) printf("  decode failed: %s\n", sl_error());
    sl_kv_cache_free(&kr);
    sl_kv_cache_free(&kg);
    return worst;
}

// The greedy generation through sl_generate (the path `shardlm generate` takes) on m.
static int generate_greedy(sl_model *m, const int *prompt, int *ids) {
    sl_generate_config gc = {N_NEW, {0.0f, 0, 1.0f}, 1, 0, NULL, 0};
    int n = 0;
    if (sl_generate(m, NULL, prompt, N_PROMPT, &gc, ids, &n, NULL) || n != N_NEW) return -1;
    return 0;
}

// Prefill + 3 decode steps twice on m (a cache reset between): the last logits, same bits.
static int repeatable(sl_model *m, const int *prompt) {
    sl_kv_cache kv;
    if (sl_kv_cache_init(&kv, m, N_PROMPT + 4)) return 0;
    size_t Vp = (size_t)m->cfg.padded_vocab_size;
    float *first = malloc(Vp * sizeof(float));
    int same = first != NULL;
    for (int run = 0; same && run < 2; run++) {
        const float *l = NULL;
        sl_kv_cache_reset(&kv);
        same = !sl_model_forward_cached(m, &kv, prompt, N_PROMPT, &l);
        for (int i = 0; same && i < 3; i++) same = !sl_kv_cache_forward(&kv, prompt[i], &l);
        if (same && run == 0) memcpy(first, l, Vp * sizeof(float));
        if (same && run == 1) same = !memcmp(first, l, Vp * sizeof(float));
    }
    free(first);
    sl_kv_cache_free(&kv);
    return same;
}

static void check_fp32(const char *preset, const sl_ops *gpu) {
    sl_model_config cfg;
    char name[160];
    sl_model c, g;
    if (sl_config_preset(&cfg, preset) || make_model(&c, &cfg, &sl_ops_cpu, NULL)) {
        report(0, preset, "setup", 0);
        return;
    }
    if (make_model(&g, &cfg, gpu, NULL)) {
        printf("FAIL %s_gpu_model: %s\n", preset, sl_error());
        failed++;
        sl_model_free(&c);
        return;
    }
    int prompt[N_PROMPT], tokens[N_NEW], ids_c[N_NEW], ids_g[N_NEW], mism, ties, ok;
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (i * 37 + 11) % cfg.vocab_size;
    double worst = decode_pair(&c, &g, prompt, FP32_TOL, &mism, &ties, tokens, &ok);
    if (ties) printf("  %s: %d of %d steps are ties on the CPU (best two logits within %.0e)\n", preset, ties, N_NEW,
                     FP32_TOL);
    snprintf(name, sizeof name, "%s_decode_logits_match_cpu", preset);
    report(ok && worst <= FP32_TOL, name, "max rel err %.2e over the prefill and every step", worst);
    snprintf(name, sizeof name, "%s_decode_greedy_tokens_match_cpu", preset);
    report(ok && mism == 0, name, "%.0f steps differ outside ties", mism);
    int gen = !generate_greedy(&c, prompt, ids_c) && !generate_greedy(&g, prompt, ids_g);
    snprintf(name, sizeof name, "%s_generate_greedy_same_tokens", preset);
    if (ties && gen) printf("  %s: a tie on the path: tokens may part there\n", preset);
    report(gen && (ties || (!memcmp(ids_c, ids_g, sizeof ids_c) && !memcmp(ids_c, tokens, sizeof ids_c))), name,
           "%.0f new tokens", N_NEW);
    snprintf(name, sizeof name, "%s_gpu_decode_is_deterministic", preset);
    report(repeatable(&g, prompt), name, "exact", 0);
    sl_model_free(&c);
    sl_model_free(&g);
}

static void check_bf16_storage(const char *preset, const sl_ops *gpu_bf16) {
    sl_model_config cfg;
    char name[160];
    sl_model c, g;
    if (sl_config_preset(&cfg, preset) || make_model(&c, &cfg, &sl_ops_cpu_bf16, NULL)) {
        report(0, preset, "setup", 0);
        return;
    }
    if (make_model(&g, &cfg, gpu_bf16, NULL)) {
        printf("FAIL %s_bf16_gpu_model: %s\n", preset, sl_error());
        failed++;
        sl_model_free(&c);
        return;
    }
    int prompt[N_PROMPT], tokens[N_NEW], mism, ties, ok;
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (i * 41 + 3) % cfg.vocab_size;
    double worst = decode_pair(&c, &g, prompt, BF16_TOL, &mism, &ties, tokens, &ok);
    snprintf(name, sizeof name, "%s_bf16_storage_decode_logits_match_emulation", preset);
    report(ok && worst <= BF16_TOL, name, "max rel err %.2e", worst);
    sl_model_free(&c);
    sl_model_free(&g);
}

// Decoding with adapters: `ref` (the CPU's fp32 table, or its bf16 emulation) and `dev` (the GPU's
// table) with the same test adapters, teacher-forced: logits within tol at every step (and greedy
// tokens equal outside ties in fp32); the CPU's logits with the adapters at least 1e-3 away from the
// same model's without them.
static void check_lora(const char *preset, const sl_ops *dev, const sl_ops *ref, const char *tag, double tol) {
    sl_model_config cfg;
    char name[160];
    sl_model c, g, b;
    sl_lora lc, lg;
    memset(&lc, 0, sizeof lc);
    memset(&lg, 0, sizeof lg);
    if (sl_config_preset(&cfg, preset) || make_model(&c, &cfg, ref, &lc)) {
        printf("FAIL %s_lora%s_setup: %s\n", preset, tag, sl_error());
        failed++;
        sl_lora_free(&lc);
        return;
    }
    if (make_model(&g, &cfg, dev, &lg)) {
        printf("FAIL %s_lora%s_gpu_model: %s\n", preset, tag, sl_error());
        failed++;
        sl_model_free(&c);
        sl_lora_free(&lc);
        sl_lora_free(&lg);
        return;
    }
    int prompt[N_PROMPT], tokens[N_NEW], base_tokens[N_NEW], mism, ties, base_mism, base_ties, ok, base_ok = 0;
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (i * 43 + 7) % cfg.vocab_size;
    double worst = decode_pair(&c, &g, prompt, tol, &mism, &ties, tokens, &ok);
    snprintf(name, sizeof name, "%s_lora%s_decode_logits_match_cpu", preset, tag);
    report(ok && worst <= tol, name, "max rel err %.2e over the prefill and every step", worst);
    if (tol < 1e-3) {
        snprintf(name, sizeof name, "%s_lora%s_decode_greedy_tokens_match_cpu", preset, tag);
        report(ok && mism == 0, name, "%.0f steps differ outside ties", mism);
    }
    double moved = 0;
    if (!make_model(&b, &cfg, ref, NULL)) {
        moved = decode_pair(&b, &c, prompt, tol, &base_mism, &base_ties, base_tokens, &base_ok);
        sl_model_free(&b);
    }
    snprintf(name, sizeof name, "%s_lora%s_adapters_move_the_logits", preset, tag);
    report(base_ok && moved >= 1e-3, name, "max rel change %.2e", moved);
    sl_model_free(&c);
    sl_model_free(&g);
    sl_lora_free(&lc);
    sl_lora_free(&lg);
}

int main(int argc, char **argv) {
    const sl_ops *gpu = gpu_open(argc, argv);
    if (!gpu) return 1;
    check_fp32("gpt2-tiny", gpu);
    check_fp32("llama-tiny", gpu);
    const sl_ops *gpu_bf16 = sl_ops_for_precision(gpu, SL_PRECISION_BF16);
    check_bf16_storage("gpt2-tiny", gpu_bf16);
    check_bf16_storage("llama-tiny", gpu_bf16);
    check_lora("gpt2-tiny", gpu, &sl_ops_cpu, "", FP32_TOL);
    check_lora("llama-tiny", gpu, &sl_ops_cpu, "", FP32_TOL);
    check_lora("gpt2-tiny", gpu_bf16, &sl_ops_cpu_bf16, "_bf16_storage", BF16_TOL);
    check_lora("llama-tiny", gpu_bf16, &sl_ops_cpu_bf16, "_bf16_storage", BF16_TOL);
    return gpu_finish(gpu);
}
