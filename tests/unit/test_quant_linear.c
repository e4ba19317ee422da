// test_quant_linear.c: the quantised linear (dequantise a tile, then GEMM) against dequantise-then-
// multiply in double precision, for 1, 7, 33 and 1023 rows, odd shapes, NF4 (with and without double
// quantisation) and int8, one part and a fused q|k|v of three parts, whole-weight and tiny tiles.
#include "test.h"

#include "ops/cpu/cpu_ops.h"
#include "shardlm/error.h"
#include "shardlm/quant_linear.h"

#include <stdint.h>

static uint64_t rng_state = 88172645463325252ull;
static float frand(void) {   // xorshift64, uniform in [-1, 1)
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}
static float *rand_array(size_t n, float scale) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = frand() * scale;
    return x;
}

// The whole dequantised weight of l (OC x IC), rows of the parts one after another.
static float *dequant_all(const sl_qlinear *l) {
    float *w = malloc((size_t)l->out_features * (size_t)l->in_features * sizeof(float));
    size_t off = 0;
    for (int p = 0; p < l->n_parts; p++) {
        sl_dequantize_range(l->part[p], 0, l->part[p]->numel, w + off);
        off += l->part[p]->numel;
    }
    return w;
}

// Largest |got - ref| / (sum of |terms| + tiny) over an (R x C) result whose reference is
// ref[r][c] = sum_k a(r, k) b(k, c), with the term magnitudes in mag.
static double worst(const float *got, const double *ref, const double *mag, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(got[i] - ref[i]) / (mag[i] + 1e-30);
        if (e > w) w = e;
    }
    return w;
}

static void check_linear(const sl_qlinear *l, int N, const char *what) {
    const int64_t OC = l->out_features, IC = l->in_features;
    float *W = dequant_all(l);
    float *x = rand_array((size_t)N * IC, 1.0f), *bias = rand_array((size_t)OC, 0.1f);
    float *dy = rand_array((size_t)N * OC, 1.0f);
    float *y = malloc((size_t)N * OC * sizeof(float)), *dx = malloc((size_t)N * IC * sizeof(float));
    double *ref = malloc((size_t)N * (OC > IC ? OC : IC) * sizeof(double));
    double *mag = malloc((size_t)N * (OC > IC ? OC : IC) * sizeof(double));
    CHECK(sl_qlinear_forward(l, y, x, bias, N) == 0);
    for (int n = 0; n < N; n++)
        for (int64_t o = 0; o < OC; o++) {
            double s = bias[o], m = fabs(bias[o]);
            for (int64_t k = 0; k < IC; k++) {
                double t = (double)x[(size_t)n * IC + k] * W[(size_t)o * IC + k];
                s += t; m += fabs(t);
            }
            ref[(size_t)n * OC + o] = s; mag[(size_t)n * OC + o] = m;
        }
    double e = worst(y, ref, mag, (size_t)N * OC);
    CHECK_MSG(e < 1e-5, "%s N=%d forward: relative error %.3g", what, N, e);
    CHECK(sl_qlinear_backward_input(l, dx, dy, N, 0) == 0);
    for (int n = 0; n < N; n++)
        for (int64_t k = 0; k < IC; k++) {
            double s = 0, m = 0;
            for (int64_t o = 0; o < OC; o++) {
                double t = (double)dy[(size_t)n * OC + o] * W[(size_t)o * IC + k];
                s += t; m += fabs(t);
            }
            ref[(size_t)n * IC + k] = s; mag[(size_t)n * IC + k] = m;
        }
    e = worst(dx, ref, mag, (size_t)N * IC);
    CHECK_MSG(e < 1e-5, "%s N=%d input gradient: relative error %.3g", what, N, e);
    // accumulate adds the same gradient on top
    float *dx2 = malloc((size_t)N * IC * sizeof(float));
    memcpy(dx2, dx, (size_t)N * IC * sizeof(float));
    CHECK(sl_qlinear_backward_input(l, dx2, dy, N, 1) == 0);
    double ea = 0;
    for (size_t i = 0; i < (size_t)N * IC; i++) {
        double d = fabs(dx2[i] - 2.0 * dx[i]) / (2.0 * mag[i] + 1e-30);
        if (d > ea) ea = d;
    }
    CHECK_MSG(ea < 1e-5, "%s N=%d accumulate: %.3g", what, N, ea);
    // one tile over a one-part weight: exactly cpu_sgemm on the dequantised matrix
    if (l->n_parts == 1 && (size_t)OC * IC <= SL_QLINEAR_TILE_FLOATS && l->tile_floats == 0) {
        float *y2 = malloc((size_t)N * OC * sizeof(float));
        for (int n = 0; n < N; n++) memcpy(y2 + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
        cpu_sgemm(0, 1, N, (int)OC, (int)IC, 1.0f, x, (int)IC, W, (int)IC, 1.0f, y2, (int)OC);
        CHECK_MSG(memcmp(y, y2, (size_t)N * OC * sizeof(float)) == 0, "%s N=%d: one tile differs from the GEMM",
                  what, N);
        free(y2);
    }
    free(W); free(x); free(bias); free(dy); free(y); free(dx); free(dx2); free(ref); free(mag);
}

static const int rows_list[] = {1, 7, 33, 1023};

static void run_type(sl_quant_type type, int dq, const char *what) {
    // one odd-shaped part (37 x 33: a short last block), then a fused q|k|v of 96, 32, 32 rows x 64
    sl_qtensor one, qkv[3];
    float *w = rand_array(37 * 33, 0.05f);
    int rc = type == SL_QUANT_INT8 ? sl_quantize_int8(&one, w, 37, 33, SL_QDT_F32)
                                   : sl_quantize_4bit(&one, w, 37, 33, type, 64, dq, SL_QDT_F32, 1);
    CHECK_MSG(rc == 0, "%s", sl_error());
    free(w);
    const int64_t parts_rows[3] = {96, 32, 32};
    for (int p = 0; p < 3; p++) {
        w = rand_array((size_t)parts_rows[p] * 64, 0.05f * (float)(p + 1));
        rc = type == SL_QUANT_INT8 ? sl_quantize_int8(&qkv[p], w, parts_rows[p], 64, SL_QDT_BF16)
                                   : sl_quantize_4bit(&qkv[p], w, parts_rows[p], 64, type, 64, dq, SL_QDT_BF16, 0);
        CHECK_MSG(rc == 0, "%s", sl_error());
        free(w);
    }
    sl_qlinear l1, l3;
    const sl_qtensor *p1[1] = {&one}, *p3[3] = {&qkv[0], &qkv[1], &qkv[2]};
    CHECK(sl_qlinear_init(&l1, 1, p1, what) == 0);
    CHECK(sl_qlinear_init(&l3, 3, p3, what) == 0);
    CHECK(l3.out_features == 160 && l3.in_features == 64);
    for (size_t i = 0; i < sizeof rows_list / sizeof rows_list[0]; i++) {
        int N = rows_list[i];
        check_linear(&l1, N, what);
        check_linear(&l3, N, what);
        l1.tile_floats = 33 * 2;    // tiles of two rows: many GEMMs, a short last tile
        l3.tile_floats = 64 * 5;    // five rows: tiles cross nothing but a part's end
        check_linear(&l1, N, what);
        check_linear(&l3, N, what);
        l1.tile_floats = l3.tile_floats = 0;
    }
    // a caller-owned tile buffer (what quant_ops.c hands every linear) gives the same results
    l3.scratch = malloc(sl_qlinear_tile_floats(&l3) * sizeof(float));
    check_linear(&l3, 7, what);
    free(l3.scratch);
    sl_qtensor_free(&one);
    for (int p = 0; p < 3; p++) sl_qtensor_free(&qkv[p]);
}

TEST(nf4_linear_equals_dequantise_then_gemm) { run_type(SL_QUANT_NF4, 0, "nf4"); }
TEST(nf4_double_quant_linear_equals_dequantise_then_gemm) { run_type(SL_QUANT_NF4, 1, "nf4 double quant"); }
TEST(int8_linear_equals_dequantise_then_gemm) { run_type(SL_QUANT_INT8, 0, "int8"); }

TEST(parts_must_share_their_input_features) {
    sl_qtensor a, b;
    float *w = rand_array(64 * 3, 0.1f);
    CHECK(sl_quantize_4bit(&a, w, 2, 64, SL_QUANT_NF4, 64, 0, SL_QDT_F32, 0) == 0);
    CHECK(sl_quantize_4bit(&b, w, 1, 128, SL_QUANT_NF4, 64, 0, SL_QDT_F32, 0) == 0);
    sl_qlinear l;
    const sl_qtensor *p[2] = {&a, &b};
    CHECK(sl_qlinear_init(&l, 2, p, "q|k") == -1);
    CHECK(strstr(sl_error(), "q|k: part 1 has 128 input features, part 0 has 64") != NULL);
    sl_qtensor_free(&a);
    sl_qtensor_free(&b);
    free(w);
}

TEST_MAIN()
