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

#include "shardlm/quant.h"

#define SL_QLINEAR_MAX_PARTS 4

typedef struct {
    int n_parts;
    const sl_qtensor *part[SL_QLINEAR_MAX_PARTS];   // stacked by rows; all with the same cols (IC)
    int64_t out_features, in_features;            // OC (sum of the parts' rows), IC
    size_t tile_floats;   // the dequantisation buffer's size in floats (0: SL_QLINEAR_TILE_FLOATS)
    float *scratch;       // optional caller-owned buffer of sl_qlinear_tile_floats(l) floats (else malloc'd per call)
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

#endif
