// quant_linear_bf16.c: the quantised linear in bf16 compute (bitsandbytes' bnb_4bit_compute_dtype
// bfloat16), forward and input gradient, a tile of weight rows at a time (see quant_linear.h).
//
// A tile's values are sl_dequantize_range's (exactly) rounded to bf16; the native path multiplies the
// bf16 tile with oneDNN (bf16 operands, fp32 accumulation), the portable path multiplies the same values held in floats with cpu_sgemm (a product of two bf16
// values is exact in fp32, so both compute the same sum, in another order). A tile's product lands in
// an fp32 buffer: the forward adds the bias there and rounds each output once into its columns of out;
// the input gradient sums the tiles there and rounds once at the end. The whole dequantised matrix
// never exists.
#include "shardlm/quant_linear.h"
#include "shardlm/error.h"
#include "ops/cpu/cpu_bf16.h"

#include <string.h>

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// Weight rows per tile, rounded down to a multiple of 64 (at least 64, or the whole part when smaller)
// so that most tiles share one shape that oneDNN's bf16 kernels block evenly (a 341-row tile of a
// 768-wide weight ran at a fraction of their speed). The native path's tile is its own bf16 buffer of
// SL_QLINEAR_BF16_TILE_VALUES (each row dequantised through a small stack chunk, no fp32 tile): fewer,
// larger tiles mean fewer parallel regions, which is what costs on a machine whose cores are shared;
// the portable path's is the fp32 scratch (sl_qlinear_tile_floats).
static int64_t tile_rows_for(const sl_qlinear *l, int native) {
    size_t cap = l->tile_floats ? l->tile_floats : SL_QLINEAR_BF16_TILE_VALUES;   // tile_floats: a test's size
    int64_t tr = native ? (int64_t)(cap / (size_t)l->in_features) : sl_qlinear_tile_rows(l);
    if (tr < 1) tr = 1;
    return tr >= 128 ? tr / 64 * 64 : tr;
}

size_t sl_qlinear_bf16_tile_values(const sl_qlinear *l) {
    return (size_t)tile_rows_for(l, 1) * (size_t)l->in_features;
}

// Floats of the tile product buffer: (N, rows of a tile) for the forward, (N, IC) for the input gradient.
static size_t acc_floats(const sl_qlinear *l, int N, int native) {
    return (size_t)N * (size_t)max64(min64(tile_rows_for(l, native), l->out_features), l->in_features);
}

size_t sl_qlinear_bf16_work_floats(const sl_qlinear *l, int N, int native) {
    // the portable path also widens its bf16 input (inp or dout) into fp32 once
    return acc_floats(l, N, native) + (native ? 0 : (size_t)N * (size_t)max64(l->in_features, l->out_features));
}

// Rows [r0, r0 + nr) of q as bf16 values, each row dequantised and rounded by the thread that owns it
// (one parallel region per tile): into l->scratch_bf16 through a stack chunk (native), or into
// l->scratch rounded in place; the pointer the GEMM reads.
#define CHUNK 256
static const void *bf16_tile(const sl_qlinear *l, const sl_qtensor *q, int64_t r0, int64_t nr, int native) {
    const size_t ic = (size_t)l->in_features;
#pragma omp parallel for schedule(static) if ((size_t)nr * ic >= SL_PAR_MIN_WORK)
    for (int64_t r = 0; r < nr; r++) {
        const size_t first = (size_t)(r0 + r) * ic;
        if (native) {
            float chunk[CHUNK];
            sl_bf16 *row = l->scratch_bf16 + (size_t)r * ic;
            for (size_t c = 0; c < ic; c += CHUNK) {
                size_t n = ic - c < CHUNK ? ic - c : CHUNK;
                sl_dequantize_range(q, first + c, n, chunk);
                for (size_t i = 0; i < n; i++) row[c + i] = sl_bf16_round(chunk[i]);
            }
        } else {
            float *row = l->scratch + (size_t)r * ic;
            sl_dequantize_range(q, first, ic, row);
            for (size_t i = 0; i < ic; i++) row[i] = sl_bf16_widen(sl_bf16_round(row[i]));
        }
    }
    return native ? (const void *)l->scratch_bf16 : (const void *)l->scratch;
}

int sl_qlinear_forward_bf16(const sl_qlinear *l, void *out, int out_f32, const sl_bf16 *inp, const sl_bf16 *bias,
                            int N, float *work, int native) {
    const int64_t tr = tile_rows_for(l, native), OC = l->out_features, IC = l->in_features;
    float *acc = work, *inp32 = work + acc_floats(l, N, native);
    if (!native) sl_bf16_to_f32_array(inp, inp32, (size_t)N * (size_t)IC);
    int64_t o = 0;   // the first output feature of the current part
    for (int p = 0; p < l->n_parts; p++) {
        const sl_qtensor *q = l->part[p];
        for (int64_t r0 = 0; r0 < q->rows; r0 += tr) {
            const int nr = (int)min64(q->rows - r0, tr);
            const void *tile = bf16_tile(l, q, r0, nr, native);
            // acc (N, nr) = inp (N, IC) @ tile^T
            if (!native)
                cpu_sgemm(0, 1, N, nr, (int)IC, 1.0f, inp32, (int)IC, tile, (int)IC, 0.0f, acc, nr);
            else if (cpu_gemm_bf16("quantised linear forward", 0, 1, N, nr, (int)IC, inp, (int)IC, tile, (int)IC, NULL,
                                   acc, 1, 0))
                return -1;
            const int64_t c0 = o + r0;
#pragma omp parallel for schedule(static) if ((size_t)N * (size_t)nr >= SL_PAR_MIN_WORK)
            for (int n = 0; n < N; n++) {
                const float *a = acc + (size_t)n * (size_t)nr;
                size_t at = (size_t)n * (size_t)OC + (size_t)c0;
                float *o32 = (float *)out + at;
                sl_bf16 *o16 = (sl_bf16 *)out + at;
                const sl_bf16 *b = bias ? bias + c0 : NULL;
                if (out_f32)
                    for (int r = 0; r < nr; r++) o32[r] = b ? a[r] + sl_bf16_widen(b[r]) : a[r];
                else
                    for (int r = 0; r < nr; r++) o16[r] = sl_bf16_round(b ? a[r] + sl_bf16_widen(b[r]) : a[r]);
            }
        }
        o += q->rows;
    }
    return 0;
}

int sl_qlinear_backward_input_bf16(const sl_qlinear *l, sl_bf16 *dinp, const sl_bf16 *dout, int N, float *work,
                                   int native) {
    const int64_t tr = tile_rows_for(l, native), OC = l->out_features, IC = l->in_features;
    float *acc = work, *dout32 = work + acc_floats(l, N, native);
    if (!native) sl_bf16_to_f32_array(dout, dout32, (size_t)N * (size_t)OC);
    int64_t o = 0;
    int first = 1;
    for (int p = 0; p < l->n_parts; p++) {
        const sl_qtensor *q = l->part[p];
        for (int64_t r0 = 0; r0 < q->rows; r0 += tr, first = 0) {
            const int nr = (int)min64(q->rows - r0, tr);
            const void *tile = bf16_tile(l, q, r0, nr, native);
            // acc (N, IC) (+)= dout[:, o + r0 : o + r0 + nr] (N, nr) @ tile (nr, IC)
            if (!native)
                cpu_sgemm(0, 0, N, (int)IC, nr, 1.0f, dout32 + o + r0, (int)OC, tile, (int)IC, first ? 0.0f : 1.0f,
                          acc, (int)IC);
            else if (cpu_gemm_bf16("quantised linear backward (dinp)", 0, 0, N, (int)IC, nr, dout + o + r0, (int)OC,
                                   tile, (int)IC, NULL, acc, 1, !first))
                return -1;
        }
        o += q->rows;
    }
    sl_f32_to_bf16_array(acc, dinp, (size_t)N * (size_t)IC);
    return 0;
}
