// precision.h: the 16-bit floating-point storage formats of mixed precision, bfloat16 and IEEE
// binary16 ("fp16", "half"), as raw bit patterns, with conversions to and from float32 that give
// PyTorch's bits: `t.to(torch.bfloat16)`, `t.half()` and `.float()` on the CPU.
//
// Invariants:
//   - float32 -> bf16/fp16 rounds to nearest, ties to even; values beyond the format's largest
//     finite value round to +-Inf exactly where IEEE says (fp16: |x| >= 65520 -> Inf); fp16 keeps
//     subnormals (smallest 2^-24) and flushes nothing; bf16 keeps float32 subnormals' top bits.
//   - bf16/fp16 -> float32 is exact (every 16-bit value is a float32 value).
//   - NaN stays NaN in every direction, never turns into Inf. Exact NaN bits:
//       f32 -> bf16: 0x7FC0 for every NaN (c10::BFloat16's round_to_nearest_even, which PyTorch's
//                    scalar and non-SIMD CPU kernels use; its AVX2/AVX-512 kernels write 0xFFFF and
//                    CUDA writes 0x7FFF: all three are NaN, only the bits differ);
//       f32 -> fp16: sign | 0x7E00 | (mantissa >> 13) (x86 F16C, what PyTorch's CPU kernels give);
//       fp16 -> f32: sign | 0x7FC00000 | (mantissa << 13) (quietened, as F16C does);
//       bf16 -> f32: the bits shifted left by 16 (payload and sign kept).
//   - Array forms give exactly the single-value results, element by element, for any thread count.
#ifndef SHARDLM_PRECISION_H
#define SHARDLM_PRECISION_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef uint16_t sl_bf16;  // bfloat16 bits: 1 sign, 8 exponent, 7 mantissa (top half of a float32)
typedef uint16_t sl_fp16;  // IEEE binary16 bits: 1 sign, 5 exponent, 10 mantissa

// The training precision chosen by DeepSpeed's "fp16" / "bf16" blocks (loss_scaler.h parses them).
typedef enum {
    SL_PRECISION_FP32 = 0,  // neither block enabled
    SL_PRECISION_BF16 = 1,  // "bf16": {"enabled": true}
    SL_PRECISION_FP16 = 2,  // "fp16": {"enabled": true}: loss scaling applies
} sl_precision;

// "fp32", "bf16" or "fp16".
const char *sl_precision_name(sl_precision p);

// ---- single values -----------------------------------------------------------------------------

// The bf16 conversions inline, for the element loops of ops on bf16 storage (the compiler vectorises
// them); the functions below and the array forms are these, so every form gives the same bits.
// float32 -> bf16 as c10::BFloat16's round_to_nearest_even: add 0x7FFF plus the lowest kept bit, keep the
// top half (a finite value whose rounding carries past the largest exponent lands exactly on Inf's
// bits); every NaN -> 0x7FC0.
static inline sl_bf16 sl_bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
    return (sl_bf16)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static inline float sl_bf16_widen(sl_bf16 h) {  // bf16 -> float32, exact
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}


sl_bf16 sl_f32_to_bf16(float x);
float sl_bf16_to_f32(sl_bf16 h);
sl_fp16 sl_f32_to_fp16(float x);
float sl_fp16_to_f32(sl_fp16 h);

// x rounded to the nearest bf16 / fp16 value and returned as a float: what storing x in a 16-bit
// tensor and reading it back gives (emulates storage precision on the CPU). Inf where fp16 overflows.
float sl_round_to_bf16(float x);
float sl_round_to_fp16(float x);

// ---- arrays (OpenMP over large n; src and dst must not overlap) ----------------------------------

void sl_f32_to_bf16_array(const float *src, sl_bf16 *dst, size_t n);
void sl_bf16_to_f32_array(const sl_bf16 *src, float *dst, size_t n);
void sl_f32_to_fp16_array(const float *src, sl_fp16 *dst, size_t n);
void sl_fp16_to_f32_array(const sl_fp16 *src, float *dst, size_t n);

// x[i] = sl_round_to_bf16(x[i]) / sl_round_to_fp16(x[i]) in place.
void sl_round_to_bf16_array(float *x, size_t n);
void sl_round_to_fp16_array(float *x, size_t n);

#endif
