// quant.c: NF4 / FP4 / int8 weights and bitsandbytes' 8-bit blockwise quantiser on the CPU, giving
// bitsandbytes 0.50's bits (the rules are in quant.h; docs/quantization.md has the derivations).
#include "shardlm/quant.h"
#include "shardlm/error.h"
#include "shardlm/precision.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// get_4bit_type("nf4"): quantiles of N(0, 1) normalised to [-1, 1] (QLoRA), as float32.
static const float nf4_code[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f,
    1.0f,
};
// get_4bit_type("fp4"): 1 sign, 2 exponent, 1 mantissa bits (bias 2), divided by its largest value 12.
static const float fp4_raw[16] = {0, 0.0625, 8, 12, 4, 6, 2, 3, 0, -0.0625, -8, -12, -4, -6, -2, -3};

// create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8), sorted, as float32.
static const float dynamic_map[256] = {
    -0x1.fc66660000000p-1f, -0x1.f533340000000p-1f, -0x1.ee00000000000p-1f, -0x1.e6cccc0000000p-1f,
    -0x1.df999a0000000p-1f, -0x1.d866660000000p-1f, -0x1.d133340000000p-1f, -0x1.ca00000000000p-1f,
    -0x1.c2cccc0000000p-1f, -0x1.bb999a0000000p-1f, -0x1.b466660000000p-1f, -0x1.ad33340000000p-1f,
    -0x1.a600000000000p-1f, -0x1.9ecccc0000000p-1f, -0x1.97999a0000000p-1f, -0x1.9066660000000p-1f,
    -0x1.8933340000000p-1f, -0x1.8200000000000p-1f, -0x1.7acccc0000000p-1f, -0x1.73999a0000000p-1f,
    -0x1.6c66680000000p-1f, -0x1.6533340000000p-1f, -0x1.5e00000000000p-1f, -0x1.56cccc0000000p-1f,
    -0x1.4f999a0000000p-1f, -0x1.4866680000000p-1f, -0x1.4133340000000p-1f, -0x1.3a00000000000p-1f,
    -0x1.32cccc0000000p-1f, -0x1.2b999a0000000p-1f, -0x1.2466680000000p-1f, -0x1.1d33340000000p-1f,
    -0x1.1600000000000p-1f, -0x1.0ecccc0000000p-1f, -0x1.0799980000000p-1f, -0x1.0066660000000p-1f,
    -0x1.f266640000000p-2f, -0x1.e400000000000p-2f, -0x1.d599980000000p-2f, -0x1.c733340000000p-2f,
    -0x1.b8cccc0000000p-2f, -0x1.aa66660000000p-2f, -0x1.9c00000000000p-2f, -0x1.8d99980000000p-2f,
    -0x1.7f33340000000p-2f, -0x1.70cccc0000000p-2f, -0x1.6266660000000p-2f, -0x1.5400000000000p-2f,
    -0x1.4599980000000p-2f, -0x1.3733340000000p-2f, -0x1.28cccc0000000p-2f, -0x1.1a66680000000p-2f,
    -0x1.0c00000000000p-2f, -0x1.fb33320000000p-3f, -0x1.de66660000000p-3f, -0x1.c1999a0000000p-3f,
    -0x1.a4cccc0000000p-3f, -0x1.8800000000000p-3f, -0x1.6b33340000000p-3f, -0x1.4e66660000000p-3f,
    -0x1.31999a0000000p-3f, -0x1.14cccc0000000p-3f, -0x1.f000000000000p-4f, -0x1.b666680000000p-4f,
    -0x1.93d70a0000000p-4f, -0x1.8851ee0000000p-4f, -0x1.7cccce0000000p-4f, -0x1.7147ae0000000p-4f,
    -0x1.65c2900000000p-4f, -0x1.5a3d700000000p-4f, -0x1.4eb8540000000p-4f, -0x1.4333340000000p-4f,
    -0x1.37ae140000000p-4f, -0x1.2c28f60000000p-4f, -0x1.20a3d60000000p-4f, -0x1.151eba0000000p-4f,
    -0x1.09999a0000000p-4f, -0x1.fc28f60000000p-5f, -0x1.e51eba0000000p-5f, -0x1.ce147a0000000p-5f,
    -0x1.b70a3e0000000p-5f, -0x1.a000000000000p-5f, -0x1.88f5c20000000p-5f, -0x1.71eb860000000p-5f,
    -0x1.5ae1460000000p-5f, -0x1.43d70a0000000p-5f, -0x1.2cccce0000000p-5f, -0x1.15c2900000000p-5f,
    -0x1.fd70a40000000p-6f, -0x1.cf5c2a0000000p-6f, -0x1.a147ae0000000p-6f, -0x1.7333340000000p-6f,
    -0x1.451eba0000000p-6f, -0x1.170a3e0000000p-6f, -0x1.d1eb860000000p-7f, -0x1.75c2900000000p-7f,
    -0x1.3e76c80000000p-7f, -0x1.2c08300000000p-7f, -0x1.19999a0000000p-7f, -0x1.072b020000000p-7f,
    -0x1.e978d40000000p-8f, -0x1.c49ba60000000p-8f, -0x1.9fbe760000000p-8f, -0x1.7ae1480000000p-8f,
    -0x1.56041a0000000p-8f, -0x1.3126e80000000p-8f, -0x1.0c49ba0000000p-8f, -0x1.ced9140000000p-9f,
    -0x1.851eb80000000p-9f, -0x1.3b645a0000000p-9f, -0x1.e353f80000000p-10f, -0x1.4fdf3a0000000p-10f,
    -0x1.eecbfe0000000p-11f, -0x1.b3d07c0000000p-11f, -0x1.78d5000000000p-11f, -0x1.3dd9820000000p-11f,
    -0x1.02de020000000p-11f, -0x1.8fc5060000000p-12f, -0x1.19ce0a0000000p-12f, -0x1.47ae160000000p-13f,
    -0x1.743e960000000p-14f, -0x1.15df660000000p-14f, -0x1.6f00680000000p-15f, -0x1.64840c0000000p-16f,
    -0x1.040bfe0000000p-17f, -0x1.b435280000000p-19f, -0x1.27476e0000000p-21f, 0.0f,
    0x1.27476e0000000p-21f, 0x1.b435280000000p-19f, 0x1.040bfe0000000p-17f, 0x1.64840c0000000p-16f,
    0x1.6f00680000000p-15f, 0x1.15df660000000p-14f, 0x1.743e960000000p-14f, 0x1.47ae160000000p-13f,
    0x1.19ce0a0000000p-12f, 0x1.8fc5060000000p-12f, 0x1.02de020000000p-11f, 0x1.3dd9820000000p-11f,
    0x1.78d5000000000p-11f, 0x1.b3d07c0000000p-11f, 0x1.eecbfe0000000p-11f, 0x1.4fdf3a0000000p-10f,
    0x1.e353f80000000p-10f, 0x1.3b645a0000000p-9f, 0x1.851eb80000000p-9f, 0x1.ced9140000000p-9f,
    0x1.0c49ba0000000p-8f, 0x1.3126e80000000p-8f, 0x1.56041a0000000p-8f, 0x1.7ae1480000000p-8f,
    0x1.9fbe760000000p-8f, 0x1.c49ba60000000p-8f, 0x1.e978d40000000p-8f, 0x1.072b020000000p-7f,
    0x1.19999a0000000p-7f, 0x1.2c08300000000p-7f, 0x1.3e76c80000000p-7f, 0x1.75c2900000000p-7f,
    0x1.d1eb860000000p-7f, 0x1.170a3e0000000p-6f, 0x1.451eba0000000p-6f, 0x1.7333340000000p-6f,
    0x1.a147ae0000000p-6f, 0x1.cf5c2a0000000p-6f, 0x1.fd70a40000000p-6f, 0x1.15c2900000000p-5f,
    0x1.2cccce0000000p-5f, 0x1.43d70a0000000p-5f, 0x1.5ae1460000000p-5f, 0x1.71eb860000000p-5f,
    0x1.88f5c20000000p-5f, 0x1.a000000000000p-5f, 0x1.b70a3e0000000p-5f, 0x1.ce147a0000000p-5f,
    0x1.e51eba0000000p-5f, 0x1.fc28f60000000p-5f, 0x1.09999a0000000p-4f, 0x1.151eba0000000p-4f,
    0x1.20a3d60000000p-4f, 0x1.2c28f60000000p-4f, 0x1.37ae140000000p-4f, 0x1.4333340000000p-4f,
    0x1.4eb8540000000p-4f, 0x1.5a3d700000000p-4f, 0x1.65c2900000000p-4f, 0x1.7147ae0000000p-4f,
    0x1.7cccce0000000p-4f, 0x1.8851ee0000000p-4f, 0x1.93d70a0000000p-4f, 0x1.b666680000000p-4f,
    0x1.f000000000000p-4f, 0x1.14cccc0000000p-3f, 0x1.31999a0000000p-3f, 0x1.4e66660000000p-3f,
    0x1.6b33340000000p-3f, 0x1.8800000000000p-3f, 0x1.a4cccc0000000p-3f, 0x1.c1999a0000000p-3f,
    0x1.de66660000000p-3f, 0x1.fb33320000000p-3f, 0x1.0c00000000000p-2f, 0x1.1a66680000000p-2f,
    0x1.28cccc0000000p-2f, 0x1.3733340000000p-2f, 0x1.4599980000000p-2f, 0x1.5400000000000p-2f,
    0x1.6266660000000p-2f, 0x1.70cccc0000000p-2f, 0x1.7f33340000000p-2f, 0x1.8d99980000000p-2f,
    0x1.9c00000000000p-2f, 0x1.aa66660000000p-2f, 0x1.b8cccc0000000p-2f, 0x1.c733340000000p-2f,
    0x1.d599980000000p-2f, 0x1.e400000000000p-2f, 0x1.f266640000000p-2f, 0x1.0066660000000p-1f,
    0x1.0799980000000p-1f, 0x1.0ecccc0000000p-1f, 0x1.1600000000000p-1f, 0x1.1d33340000000p-1f,
    0x1.2466680000000p-1f, 0x1.2b999a0000000p-1f, 0x1.32cccc0000000p-1f, 0x1.3a00000000000p-1f,
    0x1.4133340000000p-1f, 0x1.4866680000000p-1f, 0x1.4f999a0000000p-1f, 0x1.56cccc0000000p-1f,
    0x1.5e00000000000p-1f, 0x1.6533340000000p-1f, 0x1.6c66680000000p-1f, 0x1.73999a0000000p-1f,
    0x1.7acccc0000000p-1f, 0x1.8200000000000p-1f, 0x1.8933340000000p-1f, 0x1.9066660000000p-1f,
    0x1.97999a0000000p-1f, 0x1.9ecccc0000000p-1f, 0x1.a600000000000p-1f, 0x1.ad33340000000p-1f,
    0x1.b466660000000p-1f, 0x1.bb999a0000000p-1f, 0x1.c2cccc0000000p-1f, 0x1.ca00000000000p-1f,
    0x1.d133340000000p-1f, 0x1.d866660000000p-1f, 0x1.df999a0000000p-1f, 0x1.e6cccc0000000p-1f,
    0x1.ee00000000000p-1f, 0x1.f533340000000p-1f, 0x1.fc66660000000p-1f, 0x1.0000000000000p+0f,
};

const char *sl_quant_name(sl_quant_type t) {
    switch (t) {
    case SL_QUANT_NF4: return "nf4";
    case SL_QUANT_FP4: return "fp4";
    case SL_QUANT_INT8: return "int8";
    default: return "none";
    }
}

int sl_quant_parse(const char *s, sl_quant_type *out) {
    static const sl_quant_type all[] = {SL_QUANT_NONE, SL_QUANT_NF4, SL_QUANT_FP4, SL_QUANT_INT8};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (s && strcmp(s, sl_quant_name(all[i])) == 0) { *out = all[i]; return 0; }
    return sl_errorf("unknown quantisation type \"%s\" (expected nf4, fp4, int8 or none)", s ? s : "(null)");
}

const char *sl_quant_dtype_name(sl_quant_dtype d) {
    return d == SL_QDT_BF16 ? "bfloat16" : d == SL_QDT_F16 ? "float16" : "float32";
}

int sl_quant_dtype_parse(const char *s, sl_quant_dtype *out) {
    static const sl_quant_dtype all[] = {SL_QDT_F32, SL_QDT_BF16, SL_QDT_F16};
    for (size_t i = 0; i < 3; i++)
        if (s && strcmp(s, sl_quant_dtype_name(all[i])) == 0) { *out = all[i]; return 0; }
    return sl_errorf("unknown dtype \"%s\" (expected float32, bfloat16 or float16)", s ? s : "(null)");
}

void sl_quant_4bit_code(sl_quant_type t, float code[16]) {
    for (int i = 0; i < 16; i++) code[i] = t == SL_QUANT_FP4 ? fp4_raw[i] / 12.0f : nf4_code[i];
}

void sl_quant_dynamic_map(float code[256]) { memcpy(code, dynamic_map, sizeof dynamic_map); }

// ---------------------------------------------------------------- PyTorch's float sum

// utils::CeilLog2 in ATen (1 for x <= 2).
static int64_t ceil_log2(int64_t x) {
    if (x <= 2) return 1;
    int64_t r = 0;
    for (uint64_t v = (uint64_t)(x - 1); v; v >>= 1) r++;
    return r;
}

#define LANES 8   // Vectorized<float>::size() in PyTorch's x86 reduction kernels
#define ILP 4

// multi_row_sum + row_sum of ATen's SumKernel.cpp over `size` items of `w` lanes each, where item i
// lane l is x[i * w + l] (w = LANES for the vector pass, 1 for the scalar one); result in out[w].
static void cascade_row_sum(const float *x, int64_t size, int w, float *out) {
    const int64_t size_ilp = size / ILP;
    const int64_t level_power = ceil_log2(size_ilp) / 4 > 4 ? ceil_log2(size_ilp) / 4 : 4;
    const int64_t level_step = (int64_t)1 << level_power, level_mask = level_step - 1;
    float acc[4][ILP][LANES];
    memset(acc, 0, sizeof acc);
    int64_t i = 0;
    while (i + level_step <= size_ilp) {
        for (int64_t j = 0; j < level_step; j++, i++)
            for (int k = 0; k < ILP; k++)
                for (int l = 0; l < w; l++) acc[0][k][l] += x[(i * ILP + k) * w + l];
        for (int j = 1; j < 4; j++) {
            for (int k = 0; k < ILP; k++)
                for (int l = 0; l < w; l++) { acc[j][k][l] += acc[j - 1][k][l]; acc[j - 1][k][l] = 0.0f; }
            if ((i & (level_mask << (j * level_power))) != 0) break;
        }
    }
    for (; i < size_ilp; i++)
        for (int k = 0; k < ILP; k++)
            for (int l = 0; l < w; l++) acc[0][k][l] += x[(i * ILP + k) * w + l];
    for (int j = 1; j < 4; j++)
        for (int k = 0; k < ILP; k++)
            for (int l = 0; l < w; l++) acc[0][k][l] += acc[j][k][l];
    for (int64_t r = size_ilp * ILP; r < size; r++)
        for (int l = 0; l < w; l++) acc[0][0][l] += x[r * w + l];
    for (int k = 1; k < ILP; k++)
        for (int l = 0; l < w; l++) acc[0][0][l] += acc[0][k][l];
    for (int l = 0; l < w; l++) out[l] = acc[0][0][l];
}

float sl_quant_torch_mean(const float *x, size_t n) {
    if (n == 0) return NAN;
    float sum;
    if (n >= LANES) {   // vectorized_inner_sum: lanes of the whole vectors, then the tail, then the lanes
        int64_t nv = (int64_t)(n / LANES);
        float lanes[LANES];
        cascade_row_sum(x, nv, LANES, lanes);
        sum = 0.0f;
        for (size_t k = (size_t)nv * LANES; k < n; k++) sum += x[k];
        for (int l = 0; l < LANES; l++) sum += lanes[l];
    } else {
        cascade_row_sum(x, (int64_t)n, 1, &sum);
    }
    return sum / (float)n;
}

// ---------------------------------------------------------------- 8-bit blockwise (dynamic map)

#define LUT_SIZE 65536

// bitsandbytes' CPU quantiser: [-1, 1] cut into 65536 points, each mapped to the first code whose
// upper midpoint is not below it.
static void build_lut(const float code[256], uint8_t *lut) {
    float mid[255];
    for (int i = 0; i < 255; i++) mid[i] = 0.5f * (code[i] + code[i + 1]);
    int c = 0;
    for (int i = 0; i < LUT_SIZE; i++) {
        float v = -1.0f + (2.0f * (float)i) / (float)(LUT_SIZE - 1);
        while (c < 255 && mid[c] < v) c++;
        lut[i] = (uint8_t)c;
    }
}

static inline unsigned lut_index(float v) {
    v = v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v;
    float t = (v + 1.0f) * 0.5f * (float)(LUT_SIZE - 1);
    return (unsigned)(t + 0.5f);
}

int sl_quantize_blockwise8(const float code[256], const float *a, size_t n, int blocksize, float *absmax,
                           uint8_t *out) {
    uint8_t *lut = sl_malloc(LUT_SIZE, "8-bit quantisation table");
    if (!lut) return -1;
    build_lut(code, lut);
    size_t nb = (n + (size_t)blocksize - 1) / (size_t)blocksize;
#pragma omp parallel for schedule(static) if (n >= (1u << 16))
    for (size_t b = 0; b < nb; b++) {
        size_t s = b * (size_t)blocksize, e = s + (size_t)blocksize < n ? s + (size_t)blocksize : n;
        float m = 0.0f;
        for (size_t i = s; i < e; i++) m = fmaxf(m, fabsf(a[i]));
        absmax[b] = m;
        if (m == 0.0f) { memset(out + s, 0, e - s); continue; }
        float inv = 1.0f / m;
        for (size_t i = s; i < e; i++) out[i] = lut[lut_index(a[i] * inv)];
    }
    free(lut);
    return 0;
}

void sl_dequantize_blockwise8(const float code[256], const uint8_t *a, const float *absmax, size_t n, int blocksize,
                              float *out) {
    for (size_t i = 0; i < n; i++) out[i] = code[a[i]] * absmax[i / (size_t)blocksize];
}

// ---------------------------------------------------------------- 4-bit

// Index into `code` of the value nearest x in [-1, 1] with torch.bucketize's ties (to the lower value),
// over the code sorted by value (ties between equal values: the lower index first, a stable argsort).
typedef struct { float bound[15]; uint8_t order[16]; } code4_search;

static void code4_prepare(const float code[16], code4_search *s) {
    for (int i = 0; i < 16; i++) s->order[i] = (uint8_t)i;
    for (int i = 1; i < 16; i++)   // insertion sort: stable
        for (int j = i; j > 0 && code[s->order[j - 1]] > code[s->order[j]]; j--) {
            uint8_t t = s->order[j]; s->order[j] = s->order[j - 1]; s->order[j - 1] = t;
        }
    for (int i = 0; i < 15; i++) s->bound[i] = (code[s->order[i]] + code[s->order[i + 1]]) / 2.0f;
}

static inline uint8_t code4_index(const code4_search *s, float x) {
    int i = 0;
    while (i < 15 && x > s->bound[i]) i++;   // bucketize(right=False): first bound with x <= bound
    return s->order[i];
}

static void qtensor_clear(sl_qtensor *q) { memset(q, 0, sizeof *q); }

void sl_qtensor_free(sl_qtensor *q) {
    free(q->data); free(q->absmax); free(q->qabsmax); free(q->nested_absmax); free(q->scb);
    qtensor_clear(q);
}

static int valid_blocksize(int b) {
    for (int v = 32; v <= 4096; v *= 2) if (b == v) return 1;
    return 0;
}

int sl_quantize_4bit(sl_qtensor *q, const float *w, int64_t rows, int64_t cols, sl_quant_type type, int blocksize,
                     int double_quant, sl_quant_dtype dtype, int allow_partial) {
    qtensor_clear(q);
    if (type != SL_QUANT_NF4 && type != SL_QUANT_FP4)
        return sl_errorf("4-bit quantisation: type %s is not a 4-bit type (expected nf4 or fp4)", sl_quant_name(type));
    if (!valid_blocksize(blocksize))
        return sl_errorf("4-bit quantisation: block size %d (expected 32, 64, 128, 256, 512, 1024, 2048 or 4096)",
                         blocksize);
    if (rows <= 0 || cols <= 0) return sl_errorf("4-bit quantisation: empty shape [%lld, %lld]", (long long)rows,
                                                 (long long)cols);
    size_t n = (size_t)rows * (size_t)cols;
    if (!allow_partial && n % (size_t)blocksize)
        return sl_errorf("%s quantisation: a [%lld, %lld] tensor has %zu elements, not a multiple of the block size %d",
                         sl_quant_name(type), (long long)rows, (long long)cols, n, blocksize);
    q->type = type; q->dtype = dtype; q->rows = rows; q->cols = cols; q->numel = n; q->blocksize = blocksize;
    q->n_blocks = (n + (size_t)blocksize - 1) / (size_t)blocksize;
    sl_quant_4bit_code(type, q->code);
    q->data = sl_malloc((n + 1) / 2, "4-bit codes");
    float *absmax = sl_malloc(q->n_blocks * sizeof(float), "4-bit block scales");
    if (!q->data || !absmax) { free(absmax); sl_qtensor_free(q); return -1; }
    code4_search cs;
    code4_prepare(q->code, &cs);
    const uint8_t zero_code = code4_index(&cs, 0.0f);
    const size_t bs = (size_t)blocksize;
#pragma omp parallel for schedule(static) if (n >= (1u << 16))
    for (size_t b = 0; b < q->n_blocks; b++) {
        size_t s = b * bs, e = s + bs < n ? s + bs : n;
        float m = 0.0f;
        for (size_t i = s; i < e; i++) m = fmaxf(m, fabsf(w[i]));
        absmax[b] = m;
        float d = m > 1e-38f ? m : 1e-38f;
        float inv = 1.0f / d;
        int whole = e - s == bs;   // bitsandbytes multiplies by the reciprocal in whole blocks, divides in the last
        for (size_t i = s; i < e; i += 2) {   // blocks hold an even count, so a byte never straddles two
            float x0 = whole ? w[i] * inv : w[i] / d;
            x0 = x0 < -1.0f ? -1.0f : x0 > 1.0f ? 1.0f : x0;
            uint8_t c1 = zero_code;
            if (i + 1 < e) {
                float x1 = whole ? w[i + 1] * inv : w[i + 1] / d;
                x1 = x1 < -1.0f ? -1.0f : x1 > 1.0f ? 1.0f : x1;
                c1 = code4_index(&cs, x1);
            }
            q->data[i / 2] = (uint8_t)(code4_index(&cs, x0) << 4 | c1);
        }
    }
    if (!double_quant) { q->absmax = absmax; return 0; }
    q->nested = 1;
    q->offset = sl_quant_torch_mean(absmax, q->n_blocks);
    size_t nn = (q->n_blocks + SL_QUANT_NESTED_BLOCK - 1) / SL_QUANT_NESTED_BLOCK;
    q->qabsmax = sl_malloc(q->n_blocks, "double-quantised scales");
    q->nested_absmax = sl_malloc(nn * sizeof(float), "double-quantisation scales");
    if (!q->qabsmax || !q->nested_absmax) { free(absmax); sl_qtensor_free(q); return -1; }
    for (size_t b = 0; b < q->n_blocks; b++) absmax[b] -= q->offset;
    sl_quant_dynamic_map(q->nested_code);
    int rc = sl_quantize_blockwise8(q->nested_code, absmax, q->n_blocks, SL_QUANT_NESTED_BLOCK, q->nested_absmax,
                                    q->qabsmax);
    free(absmax);
    if (rc) sl_qtensor_free(q);
    return rc;
}

float sl_quant_block_scale(const sl_qtensor *q, size_t b) {
    if (!q->nested) return q->absmax[b];
    return q->nested_code[q->qabsmax[b]] * q->nested_absmax[b / SL_QUANT_NESTED_BLOCK] + q->offset;
}

// ---------------------------------------------------------------- int8 (LLM.int8() weights)

int sl_quantize_int8(sl_qtensor *q, const float *w, int64_t rows, int64_t cols, sl_quant_dtype dtype) {
    qtensor_clear(q);
    if (rows <= 0 || cols <= 0) return sl_errorf("int8 quantisation: empty shape [%lld, %lld]", (long long)rows,
                                                 (long long)cols);
    size_t n = (size_t)rows * (size_t)cols;
    q->type = SL_QUANT_INT8; q->dtype = dtype; q->rows = rows; q->cols = cols; q->numel = n;
    q->data = sl_malloc(n, "int8 weight");
    q->scb = sl_malloc((size_t)rows * sizeof(float), "int8 row scales (SCB)");
    if (!q->data || !q->scb) { sl_qtensor_free(q); return -1; }
#pragma omp parallel for schedule(static) if (n >= (1u << 16))
    for (int64_t r = 0; r < rows; r++) {
        const float *x = w + (size_t)r * (size_t)cols;
        float m = 0.0f;
        for (int64_t c = 0; c < cols; c++) m = fmaxf(m, fabsf(sl_round_to_fp16(x[c])));
        q->scb[r] = m;
        float k = (1.0f / m) * 127.0f;   // torch's `127.0 / t` is t.reciprocal() * 127
        int8_t *o = (int8_t *)q->data + (size_t)r * (size_t)cols;
        for (int64_t c = 0; c < cols; c++) o[c] = m == 0.0f ? 0 : (int8_t)nearbyintf(sl_round_to_fp16(x[c]) * k);
    }
    return 0;
}

// ---------------------------------------------------------------- dequantisation

// 1/127 as bitsandbytes writes it (7.874015718698502e-3), rounded to float32 as torch does for a
// Python scalar multiplying a float32 tensor.
static const float inv127 = 7.874015718698502e-3f;

// 4-bit codes [first, first + count) of one block (scale s) into out: whole bytes in a loop GCC vectorises.
static void dequant4_run(const sl_qtensor *q, size_t first, size_t count, float s, float *out) {
    const uint8_t *d = q->data;
    const float *code = q->code;
    size_t i = 0;
    if (first & 1) { out[i++] = code[d[first / 2] & 15] * s; }   // a low nibble first
    const uint8_t *bytes = d + (first + i) / 2;
    size_t pairs = (count - i) / 2;
    float *o = out + i;
    for (size_t k = 0; k < pairs; k++) {
        uint8_t b = bytes[k];
        o[2 * k] = code[b >> 4] * s;
        o[2 * k + 1] = code[b & 15] * s;
    }
    i += 2 * pairs;
    if (i < count) out[i] = code[d[(first + i) / 2] >> 4] * s;   // a high nibble last
}

void sl_dequantize_range(const sl_qtensor *q, size_t first, size_t count, float *out) {
    if (q->type == SL_QUANT_INT8) {
        const int8_t *d = (const int8_t *)q->data;
        const size_t cols = (size_t)q->cols;
        for (size_t i = 0; i < count;) {
            size_t k = first + i, r = k / cols, end = (r + 1) * cols - first;
            if (end > count) end = count;
            const float scb = q->scb[r];
            for (; i < end; i++) out[i] = (float)d[first + i] * scb * inv127;
        }
        return;
    }
    const size_t bs = (size_t)q->blocksize;
    for (size_t i = 0; i < count;) {
        size_t k = first + i, b = k / bs;
        size_t end = (b + 1) * bs - first;   // this block's end, relative to first
        if (end > count) end = count;
        dequant4_run(q, k, end - i, sl_quant_block_scale(q, b), out + i);
        i = end;
    }
}

size_t sl_qtensor_bytes_for(sl_quant_type type, int64_t rows, int64_t cols, int blocksize, int nested) {
    size_t numel = (size_t)rows * (size_t)cols;
    if (type == SL_QUANT_INT8) return numel + (size_t)rows * sizeof(float);
    size_t b = (numel + 1) / 2, n_blocks = (numel + (size_t)blocksize - 1) / (size_t)blocksize;
    if (!nested) return b + n_blocks * sizeof(float);
    return b + n_blocks + (n_blocks + SL_QUANT_NESTED_BLOCK - 1) / SL_QUANT_NESTED_BLOCK * sizeof(float);
}

size_t sl_qtensor_bytes(const sl_qtensor *q) {
    return sl_qtensor_bytes_for(q->type, q->rows, q->cols, q->blocksize, q->nested);
}

int sl_qtensor_validate(const sl_qtensor *q, const char *what) {
    if (q->rows <= 0 || q->cols <= 0 || q->numel != (size_t)q->rows * (size_t)q->cols || !q->data)
        return sl_errorf("%s: quantised weight has an invalid shape [%lld, %lld]", what, (long long)q->rows,
                         (long long)q->cols);
    if (q->type == SL_QUANT_INT8) return q->scb ? 0 : sl_errorf("%s: int8 weight without SCB", what);
    if (q->type != SL_QUANT_NF4 && q->type != SL_QUANT_FP4)
        return sl_errorf("%s: unknown quantisation type %d", what, (int)q->type);
    if (!valid_blocksize(q->blocksize))
        return sl_errorf("%s: block size %d (expected 32, 64, ..., 4096)", what, q->blocksize);
    if (q->n_blocks != (q->numel + (size_t)q->blocksize - 1) / (size_t)q->blocksize)
        return sl_errorf("%s: %zu block scales for %zu elements in blocks of %d", what, q->n_blocks, q->numel,
                         q->blocksize);
    if (q->nested ? !q->qabsmax || !q->nested_absmax : !q->absmax)
        return sl_errorf("%s: block scales missing", what);
    return 0;
}
