// test_precision.c: float32 <-> bfloat16 / fp16 conversions against PyTorch's bits (torch 2.15 on the
// CPU: `x.to(torch.bfloat16)`, `x.half()`, `.float()`; values pasted below, computed with
// ATEN_CPU_CAPABILITY=default and avx2, which agree except for bf16 NaN bits, see precision.h), an
// exhaustive check of round-to-nearest-even at every midpoint between adjacent 16-bit values, and
// the array forms against the single-value ones.
#include "test.h"

#include "shardlm/precision.h"

#include <stdint.h>

static uint32_t fbits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float bitsf(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

// FNV-1a 64 over little-endian bytes, as the generating script hashed numpy's outputs.
static uint64_t fnv_bytes(uint64_t h, uint32_t v, int nbytes) {
    for (int i = 0; i < nbytes; i++) {
        h ^= (v >> (8 * i)) & 0xFFu;
        h *= 0x100000001b3ULL;
    }
    return h;
}
#define FNV_INIT 0xcbf29ce484222325ULL

// {float32 bits, torch bf16 bits, torch fp16 bits}
static const struct { uint32_t f; uint16_t bf, hf; } TABLE[] = {
    {0x00000000U, 0x0000, 0x0000},
    {0x80000000U, 0x8000, 0x8000},
    {0x3F800000U, 0x3F80, 0x3C00},
    {0xBF800000U, 0xBF80, 0xBC00},
    {0x3F808000U, 0x3F80, 0x3C04},
    {0x3F818000U, 0x3F82, 0x3C0C},
    {0x3F808001U, 0x3F81, 0x3C04},
    {0x3F807FFFU, 0x3F80, 0x3C04},
    {0x3F80FFFFU, 0x3F81, 0x3C08},
    {0x3FFFFFFFU, 0x4000, 0x4000},
    {0x7F7FFFFFU, 0x7F80, 0x7C00},
    {0x7F7F8000U, 0x7F80, 0x7C00},
    {0x7F7F7FFFU, 0x7F7F, 0x7C00},
    {0xFF7FFFFFU, 0xFF80, 0xFC00},
    {0x7F800000U, 0x7F80, 0x7C00},
    {0xFF800000U, 0xFF80, 0xFC00},
    {0x7FC00000U, 0x7FC0, 0x7E00},
    {0xFFC00000U, 0x7FC0, 0xFE00},
    {0x7F800001U, 0x7FC0, 0x7E00},
    {0x7FA00000U, 0x7FC0, 0x7F00},
    {0xFFFFFFFFU, 0x7FC0, 0xFFFF},
    {0x00000001U, 0x0000, 0x0000},
    {0x00008000U, 0x0000, 0x0000},
    {0x00018000U, 0x0002, 0x0000},
    {0x007FFFFFU, 0x0080, 0x0000},
    {0x807FFFFFU, 0x8080, 0x8000},
    {0x00800000U, 0x0080, 0x0000},
    {0x80010000U, 0x8001, 0x8000},
    {0x40490FDBU, 0x4049, 0x4248},
    {0xBB23D70AU, 0xBB24, 0x991F},
    {0x000116C2U, 0x0001, 0x0000},
    {0x477FE000U, 0x4780, 0x7BFF},
    {0x477FEFFDU, 0x4780, 0x7BFF},
    {0x477FF000U, 0x4780, 0x7C00},
    {0xC77FF000U, 0xC780, 0xFC00},
    {0x47C35000U, 0x47C3, 0x7C00},
    {0x33800000U, 0x3380, 0x0001},
    {0x33000000U, 0x3300, 0x0000},
    {0x33000001U, 0x3300, 0x0001},
    {0x33C00000U, 0x33C0, 0x0002},
    {0x38800000U, 0x3880, 0x0400},
    {0x387FE000U, 0x3880, 0x0400},
    {0x3F801000U, 0x3F80, 0x3C00},
    {0x3F803000U, 0x3F80, 0x3C02},
    {0x3F801001U, 0x3F80, 0x3C01},
    {0x322BCC77U, 0x322C, 0x0000},
    {0xB22BCC77U, 0xB22C, 0x8000},
    {0x3DCCCCCDU, 0x3DCD, 0x2E66},
    {0xBDCCCCCDU, 0xBDCD, 0xAE66},
    {0x387FDA40U, 0x3880, 0x03FF},
    {0x33000002U, 0x3300, 0x0001},
    {0x337FFAE5U, 0x3380, 0x0001},
    {0x420551ECU, 0x4205, 0x502B},
    {0xC49A522BU, 0xC49A, 0xE4D3},
};

TEST(table_matches_torch) {
    for (size_t i = 0; i < sizeof TABLE / sizeof TABLE[0]; i++) {
        float x = bitsf(TABLE[i].f);
        sl_bf16 b = sl_f32_to_bf16(x);
        sl_fp16 h = sl_f32_to_fp16(x);
        CHECK_MSG(b == TABLE[i].bf, "f32 0x%08X -> bf16 0x%04X, torch 0x%04X", TABLE[i].f, b, TABLE[i].bf);
        CHECK_MSG(h == TABLE[i].hf, "f32 0x%08X -> fp16 0x%04X, torch 0x%04X", TABLE[i].f, h, TABLE[i].hf);
    }
}

TEST(special_values) {
    // overflow to Inf, largest finite, smallest subnormal, signed zero
    CHECK(sl_f32_to_fp16(65504.0f) == 0x7BFF);
    CHECK(sl_f32_to_fp16(65520.0f) == 0x7C00);
    CHECK(sl_f32_to_fp16(-1e30f) == 0xFC00);
    CHECK(sl_f32_to_bf16(3.4e38f) == 0x7F80);
    CHECK(sl_fp16_to_f32(0x0001) == 0x1p-24f);
    CHECK(sl_fp16_to_f32(0x03FF) == 1023 * 0x1p-24f);
    CHECK(sl_fp16_to_f32(0x7BFF) == 65504.0f);
    CHECK(fbits(sl_fp16_to_f32(0x8000)) == 0x80000000u);
    CHECK(isinf(sl_fp16_to_f32(0xFC00)) && sl_fp16_to_f32(0xFC00) < 0);
    CHECK(isinf(sl_bf16_to_f32(0x7F80)));
    // NaN stays NaN, never Inf; torch's back-conversion bits
    CHECK(sl_f32_to_bf16(NAN) == 0x7FC0);
    CHECK(isnan(sl_bf16_to_f32(sl_f32_to_bf16(bitsf(0x7F800001u)))));
    CHECK(isnan(sl_fp16_to_f32(sl_f32_to_fp16(bitsf(0xFF800001u)))));
    CHECK(fbits(sl_fp16_to_f32(0x7C01)) == 0x7FC02000u);
    CHECK(fbits(sl_fp16_to_f32(0xFC01)) == 0xFFC02000u);
    CHECK(fbits(sl_fp16_to_f32(0x7E00)) == 0x7FC00000u);
    CHECK(fbits(sl_fp16_to_f32(0x7D00)) == 0x7FE00000u);
    CHECK(fbits(sl_fp16_to_f32(0x83FF)) == 0xB87FC000u);
    CHECK(fbits(sl_bf16_to_f32(0x7F81)) == 0x7F810000u);
    CHECK(fbits(sl_bf16_to_f32(0xFFC1)) == 0xFFC10000u);
    // rounding helpers
    CHECK(sl_round_to_bf16(1.00390625f) == 1.0f);       // tie -> even
    CHECK(sl_round_to_bf16(1.01171875f) == 1.015625f);  // tie -> even (up)
    CHECK(sl_round_to_fp16(1.0f + 0x1p-11f) == 1.0f);
    CHECK(sl_round_to_fp16(0.1f) == 0.0999755859375f);
    CHECK(isinf(sl_round_to_fp16(70000.0f)));
    CHECK(sl_round_to_fp16(1e-8f) == 0.0f);
    CHECK(sl_round_to_fp16(3e-8f) == 0x1p-24f);
    CHECK(strcmp(sl_precision_name(SL_PRECISION_BF16), "bf16") == 0);
}

// All 65536 patterns of each format back to float32, hashed; torch's hashes pasted.
TEST(all_16bit_patterns_to_f32_match_torch) {
    uint64_t hf = FNV_INIT, hb = FNV_INIT;
    for (uint32_t v = 0; v < 65536; v++) {
        hf = fnv_bytes(hf, fbits(sl_fp16_to_f32((sl_fp16)v)), 4);
        hb = fnv_bytes(hb, fbits(sl_bf16_to_f32((sl_bf16)v)), 4);
    }
    CHECK_MSG(hf == 0x5D79F1B086F30345ULL, "fp16->f32 hash %016llX", (unsigned long long)hf);
    CHECK_MSG(hb == 0x43A13836C4CA3B25ULL, "bf16->f32 hash %016llX", (unsigned long long)hb);
}

// 200000 float32 bit patterns from xorshift32 (seed 2463534242) through both conversions, hashed
// (bf16 NaN outputs taken as 0x7FC0 on both sides; 803 of the inputs are NaNs).
TEST(random_patterns_match_torch) {
    uint32_t s = 2463534242u;
    uint64_t hb = FNV_INIT, hf = FNV_INIT;
    for (int i = 0; i < 200000; i++) {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        float x = bitsf(s);
        hb = fnv_bytes(hb, sl_f32_to_bf16(x), 2);
        hf = fnv_bytes(hf, sl_f32_to_fp16(x), 2);
    }
    CHECK_MSG(hb == 0x475A01CAFAD0C2B9ULL, "bf16 hash %016llX", (unsigned long long)hb);
    CHECK_MSG(hf == 0x20B34B6A5719B35DULL, "fp16 hash %016llX", (unsigned long long)hf);
}

// Independent of torch: every finite 16-bit value round-trips, and at the exact midpoint between two
// adjacent values the even one wins, while one float32 ulp either side picks the nearer one.
static void check_midpoints(int is_fp16) {
    int bad = 0;
    for (uint32_t v = 0; v < 0x8000 && bad < 5; v++) {
        uint32_t exp_mask = is_fp16 ? 0x7C00u : 0x7F80u;
        if ((v & exp_mask) == exp_mask) continue;  // Inf / NaN
        for (int sgn = 0; sgn < 2; sgn++) {
            uint16_t lo = (uint16_t)(v | (sgn ? 0x8000u : 0u)), hi = (uint16_t)(lo + 1);
            float a = is_fp16 ? sl_fp16_to_f32(lo) : sl_bf16_to_f32(lo);
            float b = is_fp16 ? sl_fp16_to_f32(hi) : sl_bf16_to_f32(hi);
            uint16_t back = is_fp16 ? sl_f32_to_fp16(a) : sl_f32_to_bf16(a);
            if (back != lo) {
                bad++;
                CHECK_MSG(0, "%s 0x%04X does not round-trip (0x%04X)", is_fp16 ? "fp16" : "bf16", lo, back);
            }
            if (isinf(b) && !is_fp16) continue;       // bf16: the midpoint to 2^128 is not a float
            double mid_d = isinf(b) ? copysign(65520.0, (double)a) : ((double)a + (double)b) / 2.0;  // +-65520
            float mid = (float)mid_d;
            if ((double)mid != mid_d) { bad++; CHECK_MSG(0, "midpoint not exact"); continue; }
            uint16_t even = (lo & 1u) ? hi : lo;
            float above = nextafterf(mid, sgn ? -INFINITY : INFINITY), below = nextafterf(mid, 0.0f);
            uint16_t r_mid = is_fp16 ? sl_f32_to_fp16(mid) : sl_f32_to_bf16(mid);
            uint16_t r_above = is_fp16 ? sl_f32_to_fp16(above) : sl_f32_to_bf16(above);
            uint16_t r_below = is_fp16 ? sl_f32_to_fp16(below) : sl_f32_to_bf16(below);
            if (r_mid != even || r_above != hi || r_below != lo) {
                bad++;
                CHECK_MSG(0, "%s between 0x%04X and 0x%04X: mid -> 0x%04X, above -> 0x%04X, below -> 0x%04X",
                          is_fp16 ? "fp16" : "bf16", lo, hi, r_mid, r_above, r_below);
            }
        }
    }
}

TEST(fp16_round_to_nearest_even_everywhere) { check_midpoints(1); }
TEST(bf16_round_to_nearest_even_everywhere) { check_midpoints(0); }

TEST(arrays_equal_single_values) {
    size_t n = 100003;  // above the OpenMP threshold, odd
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), *z = malloc(n * sizeof *z);
    sl_bf16 *b = malloc(n * sizeof *b);
    sl_fp16 *h = malloc(n * sizeof *h);
    CHECK(x && y && z && b && h);
    if (!x || !y || !z || !b || !h) return;
    uint32_t s = 12345u;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)((int32_t)s) * 0x1p-20f;  // spans fp16 overflow, normals and subnormals
        if (i % 97 == 0) x[i] *= 0x1p-30f;
    }
    x[5] = NAN;
    x[6] = -INFINITY;
    sl_f32_to_bf16_array(x, b, n);
    sl_f32_to_fp16_array(x, h, n);
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += b[i] != sl_f32_to_bf16(x[i]) || h[i] != sl_f32_to_fp16(x[i]);
    CHECK(bad == 0);
    sl_bf16_to_f32_array(b, y, n);
    sl_fp16_to_f32_array(h, z, n);
    bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += fbits(y[i]) != fbits(sl_bf16_to_f32(b[i])) || fbits(z[i]) != fbits(sl_fp16_to_f32(h[i]));
    CHECK(bad == 0);
    memcpy(y, x, n * sizeof *x);
    memcpy(z, x, n * sizeof *x);
    sl_round_to_bf16_array(y, n);
    sl_round_to_fp16_array(z, n);
    bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += fbits(y[i]) != fbits(sl_round_to_bf16(x[i])) || fbits(z[i]) != fbits(sl_round_to_fp16(x[i]));
    CHECK(bad == 0);
    free(x); free(y); free(z); free(b); free(h);
}

TEST_MAIN()
