// quant_linear.h: a linear layer whose weight is quantised (quant.h), on the CPU, dequantising a tile
// of output rows at a time into a small fp32 buffer and multiplying with the fp32 GEMM (cpu_sgemm):
// the whole dequantised matrix never exists. The frozen base of QLoRA needs the forward and the input
// gradient only (no weight gradient).
//
// The weight is (OC, IC) as nn.Linear stores it, possibly several quantised matrices stacked by rows
// (the model's fused q|k|v and gate|up weights: bitsandbytes quantises q_proj, k_proj and v_proj each
// with its own blocks and scales, so they stay separate parts here).
//
// Numerics: each tile's product is cpu_sgemm's on the dequantised tile, whose values are exactly
// sl_dequantize_range's (bitsandbytes' dequantised weight), so the forward equals dequantise-then-GEMM
// up to the GEMM's own summation order (bit-equal when one tile covers the weight); the input gradient
// sums over tiles of OC one after another, which differs from one whole GEMM by fp32 rounding only.
#ifndef SHARDLM_QUANT_LINEAR_H
#define SHARDLM_QUANT_LINEAR_H

#include "shardlm/precision.h"
#include "shardlm/quant.h"

#define SL_QLINEAR_MAX_PARTS 4

typedef struct {
    int n_parts;
    const sl_qtensor *part[SL_QLINEAR_MAX_PARTS];   // stacked by rows; all with the same cols (IC)
    int64_t out_features, in_features;            // OC (sum of the parts' rows), IC
    size_t tile_floats;   // the dequantisation buffer's size in floats (0: SL_QLINEAR_TILE_FLOATS)
    float *scratch;       // optional caller-owned buffer of sl_qlinear_tile_floats(l) floats (else malloc'd per call)
    sl_bf16 *scratch_bf16;   // the bf16 tile of the bf16 functions below (native), sl_qlinear_bf16_tile_values(l)
} sl_qlinear;

// 256 Ki floats (1 MiB): big enough that each GEMM call is efficient, small enough to stay in cache.
#define SL_QLINEAR_TILE_FLOATS ((size_t)1 << 18)

// Sets up l over parts[0..n) (checks they share IC and are valid); -1 with a message naming `what`.
int sl_qlinear_init(sl_qlinear *l, int n, const sl_qtensor *const *parts, const char *what);

// Floats of the tile buffer a call uses: whole weight rows, at most tile_floats unless one row is larger.
size_t sl_qlinear_tile_floats(const sl_qlinear *l);

// out (N, OC) = inp (N, IC) @ W^T (+ bias (OC) when not NULL). -1 only when the tile buffer cannot be
// allocated (never with a scratch buffer).
int sl_qlinear_forward(const sl_qlinear *l, float *out, const float *inp, const float *bias, int N);

// dinp (N, IC) = dout (N, OC) @ W, overwritten (accumulate != 0: added to dinp instead).
int sl_qlinear_backward_input(const sl_qlinear *l, float *dinp, const float *dout, int N, int accumulate);

// Weight rows per tile, and rows [r0, r0 + nr) of q dequantised into tile (nr x IC floats, the rows
// split over the threads): the pieces quant_linear_bf16.c shares.
int64_t sl_qlinear_tile_rows(const sl_qlinear *l);
void sl_qlinear_dequant_rows(const sl_qtensor *q, int64_t r0, int64_t nr, float *tile);

// ---- bf16 compute: bitsandbytes' bnb_4bit_compute_dtype=torch.bfloat16 (quant_linear_bf16.c) ----
// Activations are bf16 storage (ops.h act_bf16). Each tile is dequantised to fp32 (the values above)
// and rounded to bf16 (nearest even: bitsandbytes' dequantised weight .to(torch.bfloat16)); the products
// of bf16 operands accumulate in fp32 and an output is rounded once. native = 1 multiplies with
// oneDNN's bf16 matmul (cpu_gemm_bf16; needs l->scratch_bf16); native = 0 with the
// same operands widened to fp32 through cpu_sgemm (the bf16 emulation's arithmetic, for a CPU without
// bf16 instructions; needs l->scratch). work: sl_qlinear_bf16_work_floats(l, N, native) floats. 0, or
// -1 with a message naming the shape (a failing oneDNN call).
size_t sl_qlinear_bf16_work_floats(const sl_qlinear *l, int N, int native);

// 1 Mi values (2 MiB; tile_floats, when set, instead): the native path's bf16 tile, whole weight rows
// (a multiple of 64 where it holds 128 or more); sl_qlinear_bf16_tile_values gives one linear's.
#define SL_QLINEAR_BF16_TILE_VALUES ((size_t)1 << 20)
size_t sl_qlinear_bf16_tile_values(const sl_qlinear *l);

// out (N, OC) = inp (N, IC) @ bf16(W)^T (+ bias (OC), added in fp32), out bf16 (rounded once) or, with
// out_f32, fp32.
int sl_qlinear_forward_bf16(const sl_qlinear *l, void *out, int out_f32, const sl_bf16 *inp, const sl_bf16 *bias,
                            int N, float *work, int native);

// dinp (N, IC) = dout (N, OC) @ bf16(W), summed in fp32 over the tiles and rounded once, overwritten.
int sl_qlinear_backward_input_bf16(const sl_qlinear *l, sl_bf16 *dinp, const sl_bf16 *dout, int N, float *work,
                                   int native);

#endif
