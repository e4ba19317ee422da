// test_sampler.c: greedy, top-k, top-p and temperature sampling against their definitions,
// empirical frequencies against the softmax, determinism, and bad arguments.
#include "test.h"

#include "shardlm/error.h"
#include "shardlm/rng.h"
#include "shardlm/sampler.h"

static int draw(const float *logits, int n, float t, int k, float p, sl_rng *rng) {
    sl_sampler_config c = {t, k, p};
    return sl_sample(logits, n, &c, rng);
}

TEST(greedy_is_argmax) {
    float l[6] = {0.1f, 2.0f, -1.0f, 3.5f, 3.5f, 0.0f};
    sl_rng r = sl_rng_make(1, 0, 0, SL_RNG_TEST);
    CHECK(sl_argmax(l, 6) == 3);  // lowest index on ties
    CHECK(draw(l, 6, 0.0f, 0, 1.0f, &r) == 3);
    CHECK(draw(l, 6, 0.0f, 2, 0.5f, &r) == 3);
    CHECK(r.counter == 0);  // greedy draws nothing
    CHECK(sl_argmax(l, 0) == -1);
}

// The plain scan sl_argmax's vector passes must equal: the first index of the largest value, NaNs
// never chosen unless at index 0.
static int scan_argmax(const float *l, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    return best;
}

TEST(argmax_equals_the_scan) {
    float l[100];
    sl_rng r = sl_rng_make(7, 0, 0, SL_RNG_TEST);
    for (int trial = 0; trial < 2000; trial++) {
        int n = 1 + trial % 100;
        for (int i = 0; i < n; i++) {
            int kind = (int)sl_rng_below(&r, 10);  // a few values only, so ties, zeros and NaNs meet
            l[i] = kind == 0 ? NAN : kind == 1 ? 0.0f : kind == 2 ? -0.0f : kind == 3 ? -INFINITY
                 : kind == 4 ? INFINITY : (float)sl_rng_below(&r, 4) - 2.0f;
        }
        if (trial % 7 == 0) l[0] = NAN;
        int got = sl_argmax(l, n), want = scan_argmax(l, n);
        CHECK(got == want);
        if (got != want) break;
    }
}

TEST(top_k_one_is_argmax) {
    float l[5] = {0.3f, -2.0f, 1.7f, 1.6f, 0.0f};
    sl_rng r = sl_rng_make(2, 0, 0, SL_RNG_TEST);
    for (int i = 0; i < 200; i++) CHECK(draw(l, 5, 1.5f, 1, 1.0f, &r) == 2);
    CHECK(r.counter == 200);  // one uniform per sampled token
}

TEST(top_p_excludes_tail) {
    // probabilities 0.5, 0.3, 0.15, 0.05 (shuffled positions)
    float l[4] = {logf(0.15f), logf(0.5f), logf(0.05f), logf(0.3f)};
    sl_rng r = sl_rng_make(3, 0, 0, SL_RNG_TEST);
    int count[4] = {0};
    for (int i = 0; i < 4000; i++) count[draw(l, 4, 1.0f, 0, 0.7f, &r)]++;
    CHECK(count[0] == 0 && count[2] == 0);           // 0.5 < 0.7 <= 0.8: only the top two survive
    CHECK(count[1] > 0 && count[3] > 0);
    CHECK(fabs(count[1] / 4000.0 - 0.625) < 0.04);   // renormalised 0.5 / 0.8
    for (int i = 0; i < 1000; i++) CHECK(draw(l, 4, 1.0f, 0, 0.2f, &r) == 1);  // always at least one
}

TEST(top_p_applies_after_top_k) {
    // top_k = 2 renormalises {0.5, 0.3} to {0.625, 0.375}; top_p = 0.6 then keeps only the first.
    float l[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    sl_rng r = sl_rng_make(4, 0, 0, SL_RNG_TEST);
    for (int i = 0; i < 1000; i++) CHECK(draw(l, 4, 1.0f, 2, 0.6f, &r) == 0);
    int seen1 = 0;  // without top_k, 0.5 < 0.6 so the second token survives too
    for (int i = 0; i < 1000; i++) seen1 += draw(l, 4, 1.0f, 0, 0.6f, &r) == 1;
    CHECK(seen1 > 200);
}

TEST(top_k_keeps_ties) {
    float l[4] = {1.0f, 1.0f, 1.0f, 0.0f};
    sl_rng r = sl_rng_make(5, 0, 0, SL_RNG_TEST);
    int count[4] = {0};
    for (int i = 0; i < 3000; i++) count[draw(l, 4, 1.0f, 2, 1.0f, &r)]++;
    CHECK(count[0] > 800 && count[1] > 800 && count[2] > 800 && count[3] == 0);
}

// Frequencies within 5 standard deviations of the expected probabilities.
static void check_frequencies(const float *l, int n, float t, int k, uint64_t seed) {
    double p[16], total = 0.0, max = -INFINITY;
    float kth = -INFINITY;
    if (k > 0) {  // k-th largest (the test logits are distinct), by counting
        for (int i = 0; i < n; i++) {
            int above = 0;
            for (int j = 0; j < n; j++) above += l[j] > l[i];
            if (above == k - 1) kth = l[i];
        }
    }
    for (int i = 0; i < n; i++) max = fmax(max, l[i]);
    for (int i = 0; i < n; i++) total += p[i] = l[i] >= kth ? exp((l[i] - max) / t) : 0.0;
    int count[16] = {0}, draws = 20000;
    sl_rng r = sl_rng_make(seed, 0, 0, SL_RNG_TEST);
    for (int i = 0; i < draws; i++) count[draw(l, n, t, k, 1.0f, &r)]++;
    for (int i = 0; i < n; i++) {
        double q = p[i] / total, f = count[i] / (double)draws;
        double sigma = sqrt(q * (1 - q) / draws);
        CHECK_MSG(fabs(f - q) <= 5 * sigma + 1e-12, "token %d: frequency %.4f, probability %.4f", i, f, q);
    }
}

TEST(frequencies_match_softmax) {
    float l[6] = {0.5f, -0.3f, 1.2f, 0.0f, -1.5f, 0.9f};
    check_frequencies(l, 6, 1.0f, 0, 10);
    check_frequencies(l, 6, 0.6f, 0, 11);
    check_frequencies(l, 6, 2.0f, 0, 12);
    check_frequencies(l, 6, 1.0f, 3, 13);
}

TEST(deterministic_for_same_rng) {
    enum { V = 50257 };
    float *l = malloc(V * sizeof *l);
    sl_rng g = sl_rng_make(6, 0, 0, SL_RNG_TEST);
    for (int i = 0; i < V; i++) l[i] = 3.0f * sl_rng_normal(&g);
    int a[50], b[50], c[50];
    sl_rng r1 = sl_rng_make(7, 0, 0, SL_RNG_SAMPLE), r2 = sl_rng_make(7, 0, 0, SL_RNG_SAMPLE);
    sl_rng r3 = sl_rng_make(8, 0, 0, SL_RNG_SAMPLE);
    for (int i = 0; i < 50; i++) {
        a[i] = draw(l, V, 0.8f, 40, 0.95f, &r1);
        b[i] = draw(l, V, 0.8f, 40, 0.95f, &r2);
        c[i] = draw(l, V, 0.8f, 40, 0.95f, &r3);
    }
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);
    // Every top-40 draw lies among the 40 largest logits.
    for (int i = 0; i < 50; i++) {
        int above = 0;
        for (int j = 0; j < V; j++) above += l[j] > l[a[i]];
        CHECK(a[i] >= 0 && above < 40);
    }
    // Top-p alone over the full vocabulary (sorts everything) stays deterministic too.
    sl_rng r4 = sl_rng_make(9, 0, 0, SL_RNG_SAMPLE), r5 = sl_rng_make(9, 0, 0, SL_RNG_SAMPLE);
    for (int i = 0; i < 5; i++) CHECK(draw(l, V, 1.0f, 0, 0.9f, &r4) == draw(l, V, 1.0f, 0, 0.9f, &r5));
    free(l);
}

TEST(bad_arguments) {
    float l[3] = {0.0f, NAN, 1.0f};
    sl_rng r = sl_rng_make(1, 0, 0, SL_RNG_TEST);
    CHECK(draw(l, 3, 1.0f, 0, 1.0f, &r) == -1 && strstr(sl_error(), "NaN"));
    l[1] = 0.5f;
    CHECK(draw(l, 3, -1.0f, 0, 1.0f, &r) == -1 && strstr(sl_error(), "temperature"));
    CHECK(draw(l, 3, 1.0f, 0, 0.0f, &r) == -1 && strstr(sl_error(), "top_p"));
    CHECK(draw(l, 3, 1.0f, 0, 1.5f, &r) == -1 && strstr(sl_error(), "top_p"));
    CHECK(draw(l, 3, 1.0f, -2, 1.0f, &r) == -1 && strstr(sl_error(), "top_k"));
    CHECK(draw(l, 0, 1.0f, 0, 1.0f, &r) == -1);
    float inf[2] = {-INFINITY, -INFINITY};
    CHECK(draw(inf, 2, 1.0f, 0, 1.0f, &r) == -1);
    float one_finite[3] = {-INFINITY, 2.0f, -INFINITY};
    for (int i = 0; i < 100; i++) CHECK(draw(one_finite, 3, 1.0f, 0, 1.0f, &r) == 1);
    CHECK(draw(l, 3, 1.0f, 10, 1.0f, &r) >= 0);  // top_k larger than the vocabulary: off
}

TEST_MAIN()
