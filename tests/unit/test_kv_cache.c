// test_kv_cache.c: the model's forward with a KV cache (a prefill, then one token at a time) gives the
// same logits as the full forward at every position, for both families, a sliding window shorter than
// the sequence, and emulated bf16 activation storage; a full cache is an error.
#include "test.h"

#include "shardlm/error.h"
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

TEST_MAIN()
