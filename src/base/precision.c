// precision.c: float32 <-> bfloat16 / fp16 conversions with PyTorch's bits (see precision.h).
// Invariants: integer bit manipulation only (no floating-point rounding mode or FTZ/DAZ state can
// change a result); rounding is to nearest, ties to even; NaN never becomes Inf; the array forms
// call the same inline element functions, so they equal the single-value forms bit for bit.
#include "shardlm/precision.h"

#include <string.h>

// Loops shorter than this run on one thread (OpenMP start-up costs more than the work).
#define SL_OMP_MIN 32768

const char *sl_precision_name(sl_precision p) {
    switch (p) {
    case SL_PRECISION_FP32: return "fp32";
    case SL_PRECISION_BF16: return "bf16";
    case SL_PRECISION_FP16: return "fp16";
    }
    return "?";
}

static inline uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}


static inline sl_fp16 to_fp16(float x) {
    uint32_t u = f32_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (sl_fp16)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // NaN, quietened
    if (a >= 0x477FF000u) return (sl_fp16)(sign | 0x7C00u);  // |x| >= 65520 (or Inf): rounds to Inf
    if (a >= 0x38800000u) {                                   // |x| >= 2^-14: a normal fp16
        uint32_t r = a - (112u << 23);                        // rebias the exponent: 127 -> 15
        r += 0x0FFFu + ((r >> 13) & 1u);                      // round 23 mantissa bits to 10, ties even
        return (sl_fp16)(sign | (r >> 13));                   // a carry moves into the exponent: correct
    }
    uint32_t e = a >> 23;
    if (e < 102) return (sl_fp16)sign;  // |x| < 2^-25: rounds to zero (float32 subnormals included)
    // fp16 subnormal (k x 2^-24, k <= 0x400 after rounding; 0x400 is the smallest normal's bits)
    uint32_t m = (a & 0x7FFFFFu) | 0x800000u;  // value = m x 2^(e - 150)
    uint32_t shift = 126u - e;                 // 14..24
    uint32_t k = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (k & 1u))) k++;
    return (sl_fp16)(sign | k);
}

static inline float from_fp16(sl_fp16 h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t e = ((uint32_t)h >> 10) & 0x1Fu, m = (uint32_t)h & 0x3FFu;
    if (e == 0x1F) return bits_f32(sign | (m ? 0x7FC00000u | (m << 13) : 0x7F800000u));
    if (e == 0) {
        // zero or subnormal: m x 2^-24, exact in float32
        float v = (float)m * 0x1p-24f;
        return bits_f32(sign | f32_bits(v));
    }
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

sl_bf16 sl_f32_to_bf16(float x) { return sl_bf16_round(x); }
float sl_bf16_to_f32(sl_bf16 h) { return sl_bf16_widen(h); }
sl_fp16 sl_f32_to_fp16(float x) { return to_fp16(x); }
float sl_fp16_to_f32(sl_fp16 h) { return from_fp16(h); }
float sl_round_to_bf16(float x) { return sl_bf16_widen(sl_bf16_round(x)); }
float sl_round_to_fp16(float x) { return from_fp16(to_fp16(x)); }

void sl_f32_to_bf16_array(const float *src, sl_bf16 *dst, size_t n) {
#pragma omp parallel for schedule(static) if (n >= SL_OMP_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = sl_bf16_round(src[i]);
}

void sl_bf16_to_f32_array(const sl_bf16 *src, float *dst, size_t n) {
#pragma omp parallel for schedule(static) if (n >= SL_OMP_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = sl_bf16_widen(src[i]);
}

void sl_f32_to_fp16_array(const float *src, sl_fp16 *dst, size_t n) {
#pragma omp parallel for schedule(static) if (n >= SL_OMP_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = to_fp16(src[i]);
}

void sl_fp16_to_f32_array(const sl_fp16 *src, float *dst, size_t n) {
#pragma omp parallel for schedule(static) if (n >= SL_OMP_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = from_fp16(src[i]);
}

void sl_round_to_bf16_array(float *x, size_t n) {
#pragma omp parallel for schedule(static) if (n >= SL_OMP_MIN)
    for (size_t i = 0; i < n; i++) x[i] = sl_bf16_widen(sl_bf16_round(x[i]));
}

void sl_round_to_fp16_array(float *x, size_t n) {
#pragma omp parallel for schedule(static) if (n >= SL_OMP_MIN)
    for (size_t i = 0; i < n; i++) x[i] = from_fp16(to_fp16(x[i]));
}
