// test_gemv.c: the one-row linear layers of decode (src/ops/cpu/gemv.c) against a double-precision
// product, at 1, 7, 33 and 1023 rows and columns, with and without bias:
//   * fp32: every output within 1e-6 * (IC + 1) of sum_k |w_k x_k| + |b| (fp32 summation error of IC
//     terms, a few ulps in practice), and cpu_matmul_forward at N = 1 is exactly this GEMV;
//   * bf16 operands: the products are exact in fp32, so the same bound holds against the double
//     product of the bf16 values, on the AVX512_BF16 kernel (where the CPU has it) and the portable
//     loop; the two agree bit for bit on normal numbers (they sum in the same order); a denormal
//     input, which vdpbf16ps flushes, moves an output by at most its own product (< 2^-126 here);
//   * results do not depend on the thread count.
#include "test.h"

#include "ops/cpu/cpu_bf16.h"
#include "shardlm/precision.h"
#include "shardlm/rng.h"

static const int sizes[] = {1, 7, 33, 1023};

static float *rand_f(size_t n, uint64_t seed) {
    sl_rng r = sl_rng_make(seed, 0, 0, SL_RNG_TEST);
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)sl_rng_normal(&r);
    return x;
}

static sl_bf16 *to_bf16(const float *x, size_t n) {
    sl_bf16 *y = malloc((n ? n : 1) * sizeof(sl_bf16));
    sl_f32_to_bf16_array(x, y, n);
    return y;
}

// Worst |got - want| / (sum_k |w x| + |b|) over the outputs, want and the scale in double; w, x, b are
// read through get (fp32 or widened bf16).
typedef double (*getter)(const void *p, size_t i);
static double get_f32(const void *p, size_t i) { return ((const float *)p)[i]; }
static double get_bf16(const void *p, size_t i) { return sl_bf16_to_f32(((const sl_bf16 *)p)[i]); }

static double worst_error(const float *got, getter get, const void *W, const void *x, const void *b, int OC, int IC) {
    double worst = 0;
    for (int o = 0; o < OC; o++) {
        double want = b ? get(b, (size_t)o) : 0, scale = fabs(want);
        for (int k = 0; k < IC; k++) {
            double p = get(W, (size_t)o * IC + k) * get(x, (size_t)k);
            want += p;
            scale += fabs(p);
        }
        double e = fabs(got[o] - want) / (scale > 0 ? scale : 1);
        if (e > worst) worst = e;
    }
    return worst;
}

TEST(gemv_f32_matches_double_reference) {
    for (int a = 0; a < 4; a++)
        for (int c = 0; c < 4; c++)
            for (int with_bias = 0; with_bias < 2; with_bias++) {
                int OC = sizes[a], IC = sizes[c];
                float *W = rand_f((size_t)OC * IC, 1), *x = rand_f((size_t)IC, 2), *b = with_bias ? rand_f((size_t)OC, 3) : NULL;
                float *y = malloc(sizeof(float) * (size_t)OC), *z = malloc(sizeof(float) * (size_t)OC);
                cpu_gemv_f32(y, W, x, b, OC, IC);
                double e = worst_error(y, get_f32, W, x, b, OC, IC);
                CHECK_MSG(e <= 1e-6 * (IC + 1), "OC %d IC %d bias %d: relative error %.3g", OC, IC, with_bias, e);
                // the linear layer at one row is this GEMV
                cpu_matmul_forward(ACT(z), ACT(x), ACT(W), b ? ACT(b) : NULL, 1, IC, OC);
                CHECK_MSG(!memcmp(y, z, sizeof(float) * (size_t)OC), "OC %d IC %d: matmul_forward at N = 1 differs", OC, IC);
                free(W); free(x); free(b); free(y); free(z);
            }
}

TEST(gemv_bf16_matches_double_reference_on_both_paths) {
    for (int a = 0; a < 4; a++)
        for (int c = 0; c < 4; c++)
            for (int with_bias = 0; with_bias < 2; with_bias++) {
                int OC = sizes[a], IC = sizes[c];
                float *Wf = rand_f((size_t)OC * IC, 4), *xf = rand_f((size_t)IC, 5), *bf = rand_f((size_t)OC, 6);
                sl_bf16 *W = to_bf16(Wf, (size_t)OC * IC), *x = to_bf16(xf, (size_t)IC);
                sl_bf16 *b = with_bias ? to_bf16(bf, (size_t)OC) : NULL;
                float *y[2];
                for (int native = 0; native < 2; native++) {
                    y[native] = malloc(sizeof(float) * (size_t)OC);
                    cpu_gemv_bf16_path(y[native], W, x, b, OC, IC, native);
                    double e = worst_error(y[native], get_bf16, W, x, b, OC, IC);
                    CHECK_MSG(e <= 1e-6 * (IC + 1), "OC %d IC %d bias %d %s: relative error %.3g", OC, IC, with_bias,
                              native ? "native" : "portable", e);
                }
                CHECK_MSG(!memcmp(y[0], y[1], sizeof(float) * (size_t)OC),
                          "OC %d IC %d: the vdpbf16ps kernel and the portable loop differ", OC, IC);
                free(Wf); free(xf); free(bf); free(W); free(x); free(b); free(y[0]); free(y[1]);
            }
    printf("# bf16 GEMV: %s\n", cpu_gemv_bf16_native() ? "vdpbf16ps kernel compared with the portable loop"
                                                        : "no AVX512_BF16 here: the portable loop only");
}

TEST(gemv_bf16_denormal_input_moves_output_by_at_most_its_product) {
    int IC = 70;
    float *xf = rand_f((size_t)IC, 7), *Wf = rand_f((size_t)IC, 8);
    sl_bf16 *W = to_bf16(Wf, (size_t)IC), *x = to_bf16(xf, (size_t)IC);
    x[5] = 0x0001;  // the smallest bf16 denormal, times a weight near 1
    float y[2];
    cpu_gemv_bf16_path(&y[0], W, x, NULL, 1, IC, 0);
    cpu_gemv_bf16_path(&y[1], W, x, NULL, 1, IC, 1);
    CHECK_MSG(fabs((double)y[0] - y[1]) <= fabs(y[0]) * 1e-6 + 1e-37, "portable %.9g native %.9g", y[0], y[1]);
    free(xf); free(Wf); free(W); free(x);
}

TEST(gemv_does_not_depend_on_thread_count) {
    int OC = 1023, IC = 1023;  // above the parallel threshold
    float *W = rand_f((size_t)OC * IC, 9), *x = rand_f((size_t)IC, 10), *b = rand_f((size_t)OC, 11);
    sl_bf16 *Wh = to_bf16(W, (size_t)OC * IC), *xh = to_bf16(x, (size_t)IC), *bh = to_bf16(b, (size_t)OC);
    float *y[2], *z[2];
    for (int t = 0; t < 2; t++) {
        sl_ops_cpu_set_threads(t + 1);
        y[t] = malloc(sizeof(float) * (size_t)OC);
        z[t] = malloc(sizeof(float) * (size_t)OC);
        cpu_gemv_f32(y[t], W, x, b, OC, IC);
        cpu_gemv_bf16(z[t], Wh, xh, bh, OC, IC);
    }
    sl_ops_cpu_set_threads(2);
    CHECK(!memcmp(y[0], y[1], sizeof(float) * (size_t)OC));
    CHECK(!memcmp(z[0], z[1], sizeof(float) * (size_t)OC));
    free(W); free(x); free(b); free(Wh); free(xh); free(bh);
    for (int t = 0; t < 2; t++) { free(y[t]); free(z[t]); }
}

TEST_MAIN()
