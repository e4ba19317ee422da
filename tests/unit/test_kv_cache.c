// test_kv_cache.c: the model's forward with a KV cache (a prefill, then one token at a time) gives the
// same logits as the full forward at every position, for both families, a sliding window shorter than
// the sequence, emulated bf16 activation storage and the CPU's real bf16 table (whose one-row linear
// layers are the bf16 GEMV); a full cache is an error. Generation with bf16 weights tracks fp32 within a
// stated bound; a model set up for inference has no gradients and refuses backward.
#include "test.h"

#include "shardlm/error.h"
#include "shardlm/generate.h"
#include "shardlm/kv_cache.h"

// Logits of every position by the full forward, vocab_size a row (copied: the cached forward reuses
// the activations).
static float *full_logits(sl_model *m, const int *tokens, int T) {
    CHECK(sl_model_forward(m, tokens, NULL, 1, T, NULL) == 0);
    float *out = malloc((size_t)T * m->cfg.vocab_size * sizeof(float));
    CHECK(sl_model_logits(m, 0, T, out) == 0);
    return out;
}

static double worst_rel(const float *got, const float *want, int V) {
    double worst = 0, scale = 0;
    for (int v = 0; v < V; v++) {
        worst = fmax(worst, fabs(got[v] - want[v]));
        scale = fmax(scale, fabs(want[v]));
    }
    return worst / scale;
}

// prefill: tokens fed as a prompt of `prefill` tokens, then one at a time
static void check(const sl_model_config *cfg, const sl_ops *ops, int prefill, double tol, const char *what) {
    sl_model m;
    CHECK(sl_model_create(&m, cfg, ops) == 0);
    sl_model_init_weights(&m, 42);
    int T = 20, tokens[20];
    for (int t = 0; t < T; t++) tokens[t] = (t * 31 + 7) % cfg->vocab_size;
    float *want = full_logits(&m, tokens, T);
    sl_kv_cache kv;
    CHECK(sl_kv_cache_init(&kv, &m, T) == 0);
    const float *logits;
    double worst = 0;
    CHECK(sl_model_forward_cached(&m, &kv, tokens, prefill, &logits) == 0);
    worst = fmax(worst, worst_rel(logits, want + (size_t)(prefill - 1) * cfg->vocab_size, cfg->vocab_size));
    for (int t = prefill; t < T; t++) {
        CHECK(sl_kv_cache_forward(&kv, tokens[t], &logits) == 0);
        worst = fmax(worst, worst_rel(logits, want + (size_t)t * cfg->vocab_size, cfg->vocab_size));
    }
    CHECK_MSG(worst < tol, "%s: kv-cache logits differ by %.3g relative", what, worst);
    CHECK(sl_kv_cache_forward(&kv, 1, &logits) == -1);
    CHECK(strstr(sl_error(), "full") != NULL);
    sl_kv_cache_free(&kv);
    free(want);
    sl_model_free(&m);
}

static sl_model_config preset(const char *name) {
    sl_model_config cfg;
    CHECK(sl_config_preset(&cfg, name) == 0);
    return cfg;
}

TEST(gpt2_kv_cache_matches_full_forward) {
    sl_model_config c = preset("gpt2-tiny");
    check(&c, &sl_ops_cpu, 1, 1e-5, "gpt2 token by token");
    check(&c, &sl_ops_cpu, 7, 1e-5, "gpt2 prefill 7");
}

TEST(llama_kv_cache_matches_full_forward) {
    sl_model_config c = preset("llama-tiny");
    check(&c, &sl_ops_cpu, 1, 1e-5, "llama token by token");
    check(&c, &sl_ops_cpu, 9, 1e-5, "llama prefill 9");
}

TEST(sliding_window_kv_cache_matches_full_forward) {
    sl_model_config c = preset("llama-tiny");
    c.family = SL_FAMILY_MISTRAL;
    c.sliding_window = 5;  // shorter than the prefill and the sequence
    check(&c, &sl_ops_cpu, 8, 1e-5, "mistral window 5");
}

TEST(bf16_storage_kv_cache_matches_its_full_forward) {
    sl_model_config c = preset("llama-tiny");
    check(&c, &sl_ops_cpu_bf16, 6, 2e-2, "llama cpu-bf16");
}

TEST(bf16_native_kv_cache_matches_its_full_forward) {
    char why[256];
    if (!sl_ops_cpu_bf16_native_usable(why, sizeof why)) {
        printf("# skipped: cpu-bf16-onednn not usable here (%s)\n", why);
        return;
    }
    sl_model_config g = preset("gpt2-tiny"), l = preset("llama-tiny");
    check(&g, &sl_ops_cpu_bf16_native, 7, 2e-2, "gpt2 cpu-bf16-onednn");
    check(&l, &sl_ops_cpu_bf16_native, 6, 2e-2, "llama cpu-bf16-onednn");
}

// Generation with bf16 weights against fp32 (the same weights before rounding): the bf16 run's logits
// at every position, fed the same tokens (a prefill of 5, then one at a time), stay within `tol` of the
// fp32 run's relative to the largest fp32 logit; and greedy generation from the same prompt runs to
// the end. Measured on an AMD EPYC (vdpbf16ps + oneDNN): 6.0e-3 (gpt2-tiny), 8.5e-3 (llama-tiny); the bounds
// leave about 3x margin.
static void check_bf16_tracks_fp32(const char *name, double tol) {
    const sl_ops *bf16 = sl_ops_for_precision(&sl_ops_cpu, SL_PRECISION_BF16);
    sl_model_config cfg = preset(name);
    sl_model a, b;
    CHECK(sl_model_create(&a, &cfg, &sl_ops_cpu) == 0 && sl_model_create(&b, &cfg, bf16) == 0);
    CHECK(sl_model_init_weights(&a, 7) == 0 && sl_model_init_weights(&b, 7) == 0);
    CHECK(sl_model_for_inference(&a) == 0 && sl_model_for_inference(&b) == 0);
    int T = 24, tokens[24];
    for (int t = 0; t < T; t++) tokens[t] = (t * 37 + 11) % cfg.vocab_size;
    sl_kv_cache ka, kb;
    CHECK(sl_kv_cache_init(&ka, &a, T) == 0 && sl_kv_cache_init(&kb, &b, T) == 0);
    const float *la, *lb;
    double worst = 0;
    for (int t = 0; t < T; t += t == 0 ? 5 : 1) {
        int n = t == 0 ? 5 : 1;
        CHECK(sl_model_forward_cached(&a, &ka, tokens + t, n, &la) == 0);
        CHECK(sl_model_forward_cached(&b, &kb, tokens + t, n, &lb) == 0);
        worst = fmax(worst, worst_rel(lb, la, cfg.vocab_size));
    }
    printf("# %s: bf16 weights vs fp32, worst logit difference %.3g of the largest logit (%s)\n", name, worst, bf16->name);
    CHECK_MSG(worst < tol, "%s: bf16 logits differ from fp32 by %.3g relative (bound %g)", name, worst, tol);
    sl_generate_config gc = {.max_new_tokens = 16, .sampler = {0.0f, 0, 1.0f}, .seed = 1, .stop_at_eot = 0};
    int out[16], n_out = 0;
    CHECK(sl_generate(&b, NULL, tokens, 4, &gc, out, &n_out, NULL) == 0 && n_out == 16);
    CHECK(sl_model_backward(&b, 1.0f) == -1 && strstr(sl_error(), "inference only"));
    CHECK(a.grads == NULL && b.grads == NULL && (bf16->act_bf16 ? b.params == NULL : 1));
    sl_kv_cache_free(&ka);
    sl_kv_cache_free(&kb);
    sl_model_free(&a);
    sl_model_free(&b);
}

TEST(bf16_weights_generation_tracks_fp32) {
    check_bf16_tracks_fp32("gpt2-tiny", 2e-2);
    check_bf16_tracks_fp32("llama-tiny", 2.5e-2);
}

// Decode gives the same logits bit for bit at 1 and 2 threads (its GEMVs and attention give every
// output to one thread in a fixed order), for both families and the fp32 and bf16 tables. A one-token
// prompt, so no GEMM (whose bits depend on the thread count) fills the cache; layers wide enough for
// every GEMV to run in parallel.
static void check_decode_thread_invariant(const char *name, const sl_ops *ops) {
    sl_model_config cfg = preset(name);
    cfg.n_layer = 2;
    sl_model m;
    CHECK(sl_model_create(&m, &cfg, ops) == 0 && sl_model_init_weights(&m, 3) == 0 && sl_model_for_inference(&m) == 0);
    int T = 8;
    size_t V = (size_t)cfg.vocab_size;
    float *got[2];
    for (int t = 0; t < 2; t++) {
        sl_ops_cpu_set_threads(t + 1);
        got[t] = malloc(sizeof(float) * V * (size_t)T);
        sl_kv_cache kv;
        CHECK(sl_kv_cache_init(&kv, &m, T) == 0);
        const float *logits;
        int token = 5;
        for (int i = 0; i < T; i++) {
            CHECK(sl_model_forward_cached(&m, &kv, &token, 1, &logits) == 0);
            memcpy(got[t] + (size_t)i * V, logits, sizeof(float) * V);
            token = (token * 31 + 7) % cfg.vocab_size;
        }
        sl_kv_cache_free(&kv);
    }
    sl_ops_cpu_set_threads(2);
    CHECK_MSG(!memcmp(got[0], got[1], sizeof(float) * V * (size_t)T), "%s on %s: decode logits depend on the thread count",
              name, ops->name);
    free(got[0]);
    free(got[1]);
    sl_model_free(&m);
}

TEST(decode_does_not_depend_on_thread_count) {
    const sl_ops *bf16 = sl_ops_for_precision(&sl_ops_cpu, SL_PRECISION_BF16);
    check_decode_thread_invariant("gpt2-demo", &sl_ops_cpu);
    check_decode_thread_invariant("llama-demo", &sl_ops_cpu);
    check_decode_thread_invariant("gpt2-demo", bf16);
    check_decode_thread_invariant("llama-demo", bf16);
}

TEST_MAIN()
