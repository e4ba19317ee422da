// test_attention_cudnn.c: SHARDLM_ATTENTION=cudnn's side that needs no GPU (src/ops/cuda/attention_cudnn.cu).
// The tensor views cuDNN gets (attention_cudnn_layout.h): Q, K and V land on the columns ops.h says the
// attention reads (query head h at h*HD, key head g at NH*HD + g*HD, value head g at (NH + NKV)*HD +
// g*HD of a token's row), together they cover the qkv buffer exactly once; the output and the
// statistics are the (B, T, NH*HD) and lse[(b*NH + h)*T + t] layouts; K transposed names the same
// elements. The batch slices a workspace cap makes (sl_att_cudnn_slice). And, in a build with the CUDA backend, the forward and backward operation graphs built
// through cuDNN's backend API and finalized without a GPU: every descriptor, attribute type and enum
// value accepted by the libcudnn found at run time (the kernels themselves need a GPU: test_ops_cuda's
// attention_cudnn group).
#include "test.h"

#include <stdlib.h>

#include "ops/cuda/attention_cudnn_layout.h"
#ifdef SHARDLM_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

static const struct { int B, T, NH, NKV, HD; } shapes[] = {
    {2, 5, 4, 4, 16},   // multi-head
    {3, 7, 6, 2, 8},    // grouped: 3 query heads a kv head
    {1, 4, 12, 12, 64}, // GPT-2's heads
    {2, 3, 8, 1, 32},   // multi-query
};

TEST(qkv_views_hit_the_columns_ops_h_names) {
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int B = shapes[s].B, T = shapes[s].T, NH = shapes[s].NH, NKV = shapes[s].NKV, HD = shapes[s].HD;
        const sl_att_views v = sl_att_cudnn_views(B, T, NH, NKV, HD);
        const int64_t W = (int64_t)(NH + 2 * NKV) * HD;
        int bad = 0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int d = 0; d < HD; d++) {
                    const int64_t row = ((int64_t)b * T + t) * W;
                    for (int h = 0; h < NH; h++) bad += sl_att_view_at(&v.q, b, h, t, d) != row + (int64_t)h * HD + d;
                    for (int g = 0; g < NKV; g++) {
                        bad += sl_att_view_at(&v.k, b, g, t, d) != row + (int64_t)(NH + g) * HD + d;
                        bad += sl_att_view_at(&v.v, b, g, t, d) != row + (int64_t)(NH + NKV + g) * HD + d;
                    }
                }
        CHECK_MSG(bad == 0, "shape %zu: %d elements off", s, bad);
        CHECK(v.q.dim[0] == B && v.q.dim[1] == NH && v.q.dim[2] == T && v.q.dim[3] == HD);
        CHECK(v.k.dim[1] == NKV && v.v.dim[1] == NKV && v.k.dim[3] == HD && v.v.dim[2] == T);
    }
}

TEST(q_k_v_cover_the_qkv_buffer_once) {
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int B = shapes[s].B, T = shapes[s].T, NH = shapes[s].NH, NKV = shapes[s].NKV, HD = shapes[s].HD;
        const sl_att_views v = sl_att_cudnn_views(B, T, NH, NKV, HD);
        const int64_t n = (int64_t)B * T * (NH + 2 * NKV) * HD;
        unsigned char *seen = calloc((size_t)n, 1);
        CHECK(seen != NULL);
        if (!seen) return;
        int outside = 0, twice = 0;
        const sl_att_view *views[] = {&v.q, &v.k, &v.v};
        for (int w = 0; w < 3; w++)
            for (int64_t b = 0; b < views[w]->dim[0]; b++)
                for (int64_t h = 0; h < views[w]->dim[1]; h++)
                    for (int64_t t = 0; t < views[w]->dim[2]; t++)
                        for (int64_t d = 0; d < views[w]->dim[3]; d++) {
                            const int64_t at = sl_att_view_at(views[w], b, h, t, d);
                            if (at < 0 || at >= n) { outside++; continue; }
                            twice += seen[at]++ != 0;
                        }
        int64_t missed = 0;
        for (int64_t i = 0; i < n; i++) missed += !seen[i];
        CHECK_MSG(outside == 0 && twice == 0 && missed == 0, "shape %zu: %d outside, %d twice, %lld missed", s,
                  outside, twice, (long long)missed);
        free(seen);
    }
}

TEST(output_and_stats_layouts) {
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int B = shapes[s].B, T = shapes[s].T, NH = shapes[s].NH, NKV = shapes[s].NKV, HD = shapes[s].HD;
        const sl_att_views v = sl_att_cudnn_views(B, T, NH, NKV, HD);
        int bad = 0;
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++)
                for (int t = 0; t < T; t++) {
                    bad += sl_att_view_at(&v.stats, b, h, t, 0) != ((int64_t)b * NH + h) * T + t;
                    for (int d = 0; d < HD; d++)
                        bad += sl_att_view_at(&v.o, b, h, t, d) != ((int64_t)b * T + t) * NH * HD + (int64_t)h * HD + d;
                }
        CHECK_MSG(bad == 0, "shape %zu: %d elements off", s, bad);
        CHECK(v.stats.dim[3] == 1 && v.stats.dim[1] == NH && v.o.dim[1] == NH);
    }
}

TEST(k_transposed_names_the_same_elements) {
    const sl_att_views v = sl_att_cudnn_views(2, 5, 6, 3, 16);
    const sl_att_view kt = sl_att_view_transposed(v.k);
    CHECK(kt.dim[2] == 16 && kt.dim[3] == 5 && kt.offset == v.k.offset);
    int bad = 0;
    for (int b = 0; b < 2; b++)
        for (int g = 0; g < 3; g++)
            for (int t = 0; t < 5; t++)
                for (int d = 0; d < 16; d++) bad += sl_att_view_at(&kt, b, g, d, t) != sl_att_view_at(&v.k, b, g, t, d);
    CHECK(bad == 0);
}

// SHARDLM_CUDNN_WORKSPACE_MB's slices: GPT-2 124M's deterministic backward at B = 64 (24 MiB a sequence)
// under the default 512 MiB runs as 4 calls of 16 (400 MiB), under 256 MiB as 8 of 8; a prime batch
// takes the most that fit with a shorter last slice; a sequence over the cap alone runs alone.
TEST(workspace_slices) {
    const int64_t gpt2 = (int64_t)12 * 1024 * 1024 * 2, mib = 1 << 20;
    CHECK(sl_att_cudnn_slice(64, gpt2, 512 * mib, 1) == 16);
    CHECK(sl_att_cudnn_slice(64, gpt2, 256 * mib, 1) == 8);
    CHECK(sl_att_cudnn_slice(64, gpt2, 2048 * mib, 1) == 64);  // all fit: one call
    CHECK(sl_att_cudnn_slice(64, 0, 1, 1) == 64);              // no workspace: one call
    CHECK(sl_att_cudnn_slice(13, gpt2, 100 * mib, 1) == 4);    // 4 + 4 + 4 + 1 (13's divisors: 1, 13)
    CHECK(sl_att_cudnn_slice(12, gpt2, 130 * mib, 1) == 4);    // 5 fit; 4 divides 12: three equal slices
    CHECK(sl_att_cudnn_slice(8, gpt2, gpt2 - 1, 1) == 1);      // over the cap alone
    // lse's rows a sequence (NH T) odd or 2 mod 4: slices of 4 or 2 keep every slice 16-byte aligned
    CHECK(sl_att_cudnn_slice_step(12, 1024) == 1 && sl_att_cudnn_slice_step(2, 65) == 2);
    CHECK(sl_att_cudnn_slice_step(5, 1023) == 4 && sl_att_cudnn_slice_step(1, 2) == 2);
    CHECK(sl_att_cudnn_slice(13, gpt2, 100 * mib, 2) == 4);    // 4 fit, a multiple of 2
    CHECK(sl_att_cudnn_slice(13, gpt2, 72 * mib, 2) == 2);     // 3 fit: 2 (6 slices of 2, then 1)
    CHECK(sl_att_cudnn_slice(8, gpt2, gpt2 - 1, 4) == 4);      // over the cap: the step, not 1
    CHECK(sl_att_cudnn_slice(3, gpt2, gpt2 - 1, 4) == 3);      // ... or the whole batch when smaller
    // every batch, sequence size, cap and step: a slice fits (or is the step), is at least half the
    // most that fit (the step's multiples: at least the largest below that), and is the whole batch
    // or a multiple of the step, so every slice's lse starts 16-byte aligned
    int bad = 0;
    for (int step = 1; step <= 4; step *= 2)
        for (int B = 1; B <= 96; B++)
            for (int64_t per = 1; per <= 9; per++)
                for (int64_t cap = 1; cap <= 200; cap++) {
                    const int s = sl_att_cudnn_slice(B, per, cap, step);
                    const int64_t most = cap / per < B ? cap / per : B;
                    const int64_t floor_step = most / step * step;
                    bad += s < 1 || s > B || (s > step && s * per > cap) || (s != B && s % step) ||
                           (floor_step >= step && s < B && 2 * s < floor_step);
                }
    CHECK_MSG(bad == 0, "%d (B, per, cap, step) cases sliced wrongly", bad);
}

// GPT-2's heads, GQA and MQA, head dims 16 to 128, T not a multiple of a tile, both backward forms.
TEST(graphs_finalize_without_a_gpu) {
#ifdef SHARDLM_HAVE_CUDA
    static const struct { int backward, deterministic, B, T, NH, NKV, HD; } c[] = {
        {0, 0, 4, 1024, 12, 12, 64}, {1, 1, 4, 1024, 12, 12, 64}, {1, 0, 4, 1024, 12, 12, 64},
        {0, 0, 2, 77, 4, 2, 64},     {1, 1, 2, 77, 4, 2, 64},     {1, 0, 3, 130, 6, 2, 32},
        {0, 0, 1, 200, 8, 2, 128},   {1, 1, 1, 200, 8, 2, 128},   {0, 0, 2, 65, 2, 2, 80},
        {1, 0, 2, 65, 2, 2, 80},     {1, 1, 2, 2, 4, 1, 16},      {0, 0, 1, 64, 4, 4, 96},
    };
    char why[1024];
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const int rc = cuda_attention_cudnn_check_graph(c[i].backward, c[i].deterministic, c[i].B, c[i].T, c[i].NH,
                                                        c[i].NKV, c[i].HD, why, sizeof why);
        if (rc == 1) {  // no libcudnn here: nothing to check the graphs against
            printf("  note: %s: the graphs are not checked\n", why);
            return;
        }
        CHECK_MSG(rc == 0, "%s B %d T %d heads %d/%d head dim %d%s: %s", c[i].backward ? "backward" : "forward", c[i].B,
                  c[i].T, c[i].NH, c[i].NKV, c[i].HD, c[i].backward && c[i].deterministic ? " (deterministic)" : "", why);
    }
#else
    printf("  note: built without the CUDA backend: the graphs are not checked\n");
#endif
}

TEST_MAIN()
