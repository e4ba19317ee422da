// attention_cudnn_layout.h: how cuDNN's fused attention (attention_cudnn.cu) sees shardlm's buffers, in
// plain C so that tests/unit/test_attention_cudnn_layout.c checks it on the CPU against the layout the
// CPU attention reads (ops.h): a (B, T, (NH + 2 NKV) HD) qkv activation whose row holds the NH query
// heads, then the NKV key heads, then the NKV value heads; the output (B, T, NH HD); the saved
// statistics lse[(b NH + h) T + t]. cuDNN takes each as a 4-d tensor with dims (b, h, t, d) in that
// order and any strides, so every view is the buffer itself at an element offset, no copy: Q, K and V
// are strided views into qkv (dQ, dK, dV the same views into dqkv), O and dO views of the output.
#ifndef SHARDLM_ATTENTION_CUDNN_LAYOUT_H
#define SHARDLM_ATTENTION_CUDNN_LAYOUT_H

#include <stdint.h>

typedef struct {
    int64_t dim[4];     // b, h, t, d (Stats: b, h, t, 1)
    int64_t stride[4];  // elements
    int64_t offset;     // elements from the buffer's start to element (0, 0, 0, 0)
} sl_att_view;

typedef struct {
    sl_att_view q, k, v;  // into qkv (and dq, dk, dv into dqkv)
    sl_att_view o;        // out (and dout)
    sl_att_view stats;    // lse, fp32
} sl_att_views;

static inline void sl_att_view_set(sl_att_view *v, int64_t b, int64_t h, int64_t t, int64_t d, int64_t sb,
                                   int64_t sh, int64_t st, int64_t sd, int64_t offset) {
    v->dim[0] = b, v->dim[1] = h, v->dim[2] = t, v->dim[3] = d;
    v->stride[0] = sb, v->stride[1] = sh, v->stride[2] = st, v->stride[3] = sd;
    v->offset = offset;
}

// The views of one call: B sequences of T tokens, NH query heads over NKV key / value heads (NH a
// multiple of NKV: query head h reads kv head h / (NH / NKV), as cuDNN's grouped attention does), HD
// the head dim.
static inline sl_att_views sl_att_cudnn_views(int B, int T, int NH, int NKV, int HD) {
    sl_att_views v;
    const int64_t W = (int64_t)(NH + 2 * NKV) * HD;  // a qkv row
    const int64_t C = (int64_t)NH * HD;              // an output row
    sl_att_view_set(&v.q, B, NH, T, HD, T * W, HD, W, 1, 0);
    sl_att_view_set(&v.k, B, NKV, T, HD, T * W, HD, W, 1, (int64_t)NH * HD);
    sl_att_view_set(&v.v, B, NKV, T, HD, T * W, HD, W, 1, (int64_t)(NH + NKV) * HD);
    sl_att_view_set(&v.o, B, NH, T, HD, T * C, HD, C, 1, 0);
    sl_att_view_set(&v.stats, B, NH, T, 1, (int64_t)NH * T, T, 1, 1, 0);
    return v;
}

// How many of a call's B sequences one cuDNN call takes when each needs `per_seq` bytes of workspace
// and a call may take at most `cap` (SHARDLM_CUDNN_WORKSPACE_MB): all B when they fit; else the
// largest divisor of B that fits, if it is at least half of the most that fit (every slice the same
// size: one plan, one compiled kernel); else the most that fit (a shorter last slice: a second plan).
// A slice short of B is a multiple of `step` (sl_att_cudnn_slice_step), so every slice starts
// 16-byte aligned; at least `step` (or B): a sequence that alone needs more than cap still runs. A
// slice of b sequences is the views of sl_att_cudnn_views(b, ...) at buffers moved on by
// b0 * stride[0].
static inline int sl_att_cudnn_slice(int B, int64_t per_seq, int64_t cap, int step) {
    if (per_seq <= 0 || (int64_t)B * per_seq <= cap) return B;
    const int most = (int)(cap / per_seq);
    if (most < step) return step < B ? step : B;
    for (int d = most; 2 * d >= most; d--)
        if (B % d == 0 && d % step == 0) return d;
    return most / step * step;
}

// The sequences a slice must be a multiple of: every tensor of the graph is declared 16-byte aligned,
// and a slice at sequence b0 moves lse (fp32) on by b0 NH T elements, the bf16 tensors by multiples of
// HD (a multiple of 8) elements: 4 / gcd(NH T, 4).
static inline int sl_att_cudnn_slice_step(int NH, int T) {
    const int64_t rows = (int64_t)NH * T;
    return rows % 4 == 0 ? 1 : rows % 2 == 0 ? 2 : 4;
}

// The element offset of (b, h, t, d) in a view's buffer.
static inline int64_t sl_att_view_at(const sl_att_view *v, int64_t b, int64_t h, int64_t t, int64_t d) {
    return v->offset + b * v->stride[0] + h * v->stride[1] + t * v->stride[2] + d * v->stride[3];
}

// K viewed transposed, dims (b, h, d, t): what cuDNN's first product takes as its right factor (Q K^T
// as Q times a (d, t) matrix): the same elements, the last two dims and strides swapped.
static inline sl_att_view sl_att_view_transposed(sl_att_view v) {
    int64_t x = v.dim[2];
    v.dim[2] = v.dim[3], v.dim[3] = x;
    x = v.stride[2];
    v.stride[2] = v.stride[3], v.stride[3] = x;
    return v;
}

#endif
