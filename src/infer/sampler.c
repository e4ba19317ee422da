// sampler.c: next-token selection (greedy, temperature, top-k, top-p) as in Hugging Face generate().
// Invariants: the candidate set is filtered in HF's order (temperature, top-k, top-p); at least
// one token always survives; a sampled call consumes exactly one uniform from the rng, so the same
// (logits, config, rng state) always gives the same token.
#include "shardlm/sampler.h"
#include "shardlm/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct { float logit; int id; } candidate;

// "a ranks above b": larger logit first, lower id first among equals.
static int ranks_above(candidate a, candidate b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); }

static int compare_desc(const void *pa, const void *pb) {
    candidate a = *(const candidate *)pa, b = *(const candidate *)pb;
    return ranks_above(a, b) ? -1 : ranks_above(b, a) ? 1 : 0;
}

// 16 floats (GCC's vector extension, lowered to whatever the build's -march offers).
typedef float v16f __attribute__((vector_size(64)));
typedef int v16i __attribute__((vector_size(64)));

// The first index of the largest value, NaNs never chosen (a NaN at 0 gives 0), as the plain scan
// `logits[i] > logits[best]` gives it, in two vectorised passes (a greedy decode step runs it over the
// whole vocabulary: 40 us for 50257 logits in the scan on the AMD EPYC, a token takes ~8 ms): the
// maximum in 16 lanes (the same value in any order, since a NaN never wins a comparison), then the
// first index holding it (== finds -0.0 for +0.0 as the scan's > does not pass over it).
int sl_argmax(const float *logits, int n) {
    if (n <= 0) return -1;
    float mx = logits[0];
    v16f m = mx - (v16f){0}, x;  // every lane starts at logits[0] (a NaN there stays: the scan keeps 0)
    int i = 1;
    for (; i + 16 <= n; i += 16) {
        memcpy(&x, logits + i, sizeof x);
        v16i gt = x > m;
        m = (v16f)(((v16i)x & gt) | ((v16i)m & ~gt));
    }
    for (int l = 0; l < 16; l++) mx = m[l] > mx ? m[l] : mx;
    for (; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    for (i = 0; i < n; i++)
        if (logits[i] == mx) return i;
    return 0;  // logits[0] is NaN
}

// Min-heap on rank (the root is the worst of the k kept so far).
static void sift_down(candidate *h, int k, int i) {
    for (;;) {
        int worst = i, l = 2 * i + 1, r = l + 1;
        if (l < k && ranks_above(h[worst], h[l])) worst = l;
        if (r < k && ranks_above(h[worst], h[r])) worst = r;
        if (worst == i) return;
        candidate t = h[i]; h[i] = h[worst]; h[worst] = t;
        i = worst;
    }
}

// The k-th largest logit, by a size-k heap: O(n log k), no full sort.
static float kth_largest(const float *logits, int n, int k, candidate *heap) {
    for (int i = 0; i < k; i++) heap[i] = (candidate){logits[i], i};
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(heap, k, i);
    for (int i = k; i < n; i++) {
        candidate c = {logits[i], i};
        if (ranks_above(c, heap[0])) { heap[0] = c; sift_down(heap, k, 0); }
    }
    return heap[0].logit;
}

int sl_sample(const float *logits, int n, const sl_sampler_config *cfg, sl_rng *rng) {
    if (n <= 0) return sl_errorf("sampler: vocabulary size must be positive, got %d", n);
    if (!(cfg->temperature >= 0.0f)) return sl_errorf("sampler: temperature must be >= 0, got %g", (double)cfg->temperature);
    if (!(cfg->top_p > 0.0f && cfg->top_p <= 1.0f))
        return sl_errorf("sampler: top_p must lie in (0, 1], got %g", (double)cfg->top_p);
    if (cfg->top_k < 0) return sl_errorf("sampler: top_k must be >= 0, got %d", cfg->top_k);
    for (int i = 0; i < n; i++)
        if (isnan(logits[i])) return sl_errorf("sampler: logit %d is NaN", i);
    int best = sl_argmax(logits, n);
    if (cfg->temperature == 0.0f) return best;
    if (logits[best] == -INFINITY) return sl_errorf("sampler: every logit is -inf");

    candidate *cand = sl_malloc((size_t)n * sizeof *cand, "sampler candidates");
    if (!cand) return -1;
    int m = 0;
    int sorted = 0;
    if (cfg->top_k > 0 && cfg->top_k < n) {
        float kth = kth_largest(logits, n, cfg->top_k, cand);
        for (int i = 0; i < n; i++)  // keeps ties with the k-th value, as HF's `scores < kth` filter does
            if (logits[i] >= kth) cand[m++] = (candidate){logits[i], i};
    } else {
        for (int i = 0; i < n; i++) cand[m++] = (candidate){logits[i], i};
    }
    if (cfg->top_p < 1.0f) {  // nucleus filtering needs the candidates in descending order
        qsort(cand, (size_t)m, sizeof *cand, compare_desc);
        sorted = 1;
    }

    // Unnormalised softmax of logits / temperature over the candidates, in double.
    double max_logit = logits[best], inv_t = 1.0 / (double)cfg->temperature;
    double *prob = sl_malloc((size_t)m * sizeof *prob, "sampler probabilities");
    if (!prob) { free(cand); return -1; }
    double total = 0.0;
    for (int i = 0; i < m; i++) {
        prob[i] = exp(((double)cand[i].logit - max_logit) * inv_t);
        total += prob[i];
    }
    int kept = m;
    if (sorted) {  // smallest prefix whose mass reaches top_p (HF: drop tokens whose higher mass >= top_p)
        double target = (double)cfg->top_p * total, cum = 0.0;
        for (int i = 0; i < m; i++) {
            cum += prob[i];
            if (cum >= target) { kept = i + 1; break; }
        }
    }
    double kept_total = 0.0;
    for (int i = 0; i < kept; i++) kept_total += prob[i];

    double u = (double)sl_rng_uniform(rng) * kept_total;
    int token = cand[kept - 1].id;
    double acc = 0.0;
    for (int i = 0; i < kept; i++) {
        acc += prob[i];
        if (u < acc) { token = cand[i].id; break; }
    }
    free(prob);
    free(cand);
    return token;
}
