// test_kv_cache.c: incremental decoding with the KV cache gives the same logits as the full
// training forward at every position, for both model families; a full cache is an error.
#include "test.h"

#include "shardlm/error.h"
#include "shardlm/kv_cache.h"

static void check_family(const char *preset) {
    sl_model_config cfg;
    CHECK(sl_config_preset(&cfg, preset) == 0);
    sl_model m;
    CHECK(sl_model_create(&m, &cfg, &sl_ops_cpu) == 0);
    sl_model_init_weights(&m, 42);
    int T = 20, tokens[20];
    for (int t = 0; t < T; t++) tokens[t] = (t * 31 + 7) % cfg.vocab_size;
    CHECK(sl_model_forward(&m, tokens, NULL, 1, T, NULL) == 0);
    sl_kv_cache kv;
    CHECK(sl_kv_cache_init(&kv, &m, T) == 0);
    double worst = 0, scale = 0;
    for (int t = 0; t < T; t++) {
        const float *logits;
        CHECK(sl_kv_cache_forward(&kv, tokens[t], &logits) == 0);
        for (int v = 0; v < cfg.vocab_size; v++) {
            float want = m.logits[(size_t)t * cfg.padded_vocab_size + v];
            worst = fmax(worst, fabs(logits[v] - want));
            scale = fmax(scale, fabs(want));
        }
    }
    CHECK_MSG(worst / scale < 1e-5, "%s kv-cache logits differ by %.3g relative", preset, worst / scale);
    const float *logits;
    CHECK(sl_kv_cache_forward(&kv, 1, &logits) == -1);
    CHECK(strstr(sl_error(), "full") != NULL);
    sl_kv_cache_free(&kv);
    sl_model_free(&m);
}

TEST(gpt2_kv_cache_matches_full_forward) { check_family("gpt2-tiny"); }
TEST(llama_kv_cache_matches_full_forward) { check_family("llama-tiny"); }

TEST_MAIN()
