// test_lora_ops.c: the LoRA ops of ops_list.h on the fp32 CPU table (src/ops/cpu/lora_gemm.c, four
// strided GEMMs) against the same ops composed from the table's GEMM and column ops
// (src/ops/lora_compose.h, what the bf16 tables and CUDA run, and what the CPU ran before): on a
// column slice of a wider output (col0 > 0, ld > out), with and without dx; the columns outside the
// slice are left alone, gradients accumulate, and dx NULL leaves the input gradient alone.
#include "test.h"

#include "ops/lora_compose.h"

enum { N = 37, IN = 24, R = 4, OUT = 10, LD = 31, COL0 = 9 };

static void fill(float *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
}

static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}


// One side's buffers: [0] the fused op, [1] the composition.
typedef struct {
    float y[N * LD], u[N * R], delta[N * OUT], dx[N * IN], du[N * R], dh[N * IN], dA[R * IN], dB[OUT * R];
} side;

static void run(side *s, int fused, const float *x, const float *A, const float *B, const float *dy, int with_dx) {
    const sl_ops *t = &sl_ops_cpu;
    float scale = 2.5f;
    sl_act *dx = with_dx ? ACT(s->dx) : NULL;
    if (fused) {
        t->lora_forward(ACT(s->y), ACT(s->u), ACT(s->delta), ACT(x), ACT(A), ACT(B), scale, N, IN, R, OUT, LD, COL0);
        t->lora_backward(dx, s->dA, s->dB, ACT(s->du), ACT(s->delta), ACT(s->dh), ACT(dy), ACT(x), ACT(s->u), ACT(A),
                         ACT(B), scale, N, IN, R, OUT, LD, COL0);
    } else {
        sl_lora_compose_forward(t, ACT(s->y), ACT(s->u), ACT(s->delta), ACT(x), ACT(A), ACT(B), scale, N, IN, R, OUT,
                                LD, COL0);
        sl_lora_compose_backward(t, dx, s->dA, s->dB, ACT(s->du), ACT(s->delta), ACT(s->dh), ACT(dy), ACT(x),
                                 ACT(s->u), ACT(A), ACT(B), scale, N, IN, R, OUT, LD, COL0);
    }
}

static void check_against_composition(int with_dx) {
    static float x[N * IN], A[R * IN], B[OUT * R], dy[N * LD];
    static side s[2];
    fill(x, N * IN, 1), fill(A, R * IN, 2), fill(B, OUT * R, 3), fill(dy, N * LD, 4);
    for (int k = 0; k < 2; k++) {  // the same starting outputs and gradients on both sides
        fill(s[k].y, N * LD, 5), fill(s[k].dx, N * IN, 6), fill(s[k].dA, R * IN, 7), fill(s[k].dB, OUT * R, 8);
        run(&s[k], k == 0, x, A, B, dy, with_dx);
    }
    double ey = rel_err(s[0].y, s[1].y, N * LD), eu = rel_err(s[0].u, s[1].u, N * R),
           edu = rel_err(s[0].du, s[1].du, N * R), edA = rel_err(s[0].dA, s[1].dA, R * IN),
           edB = rel_err(s[0].dB, s[1].dB, OUT * R), edx = rel_err(s[0].dx, s[1].dx, N * IN);
    printf("  dx %s: rel err y %.2e u %.2e du %.2e dA %.2e dB %.2e dx %.2e\n", with_dx ? "on" : "NULL", ey, eu, edu,
           edA, edB, edx);
    CHECK(ey < 1e-6 && eu < 1e-6 && edu < 1e-6 && edA < 1e-6 && edB < 1e-6 && edx < 1e-6);
    // outside the slice y is untouched; without dx the input gradient is untouched
    static float y0[N * LD], dx0[N * IN];
    fill(y0, N * LD, 5), fill(dx0, N * IN, 6);
    int outside_kept = 1;
    for (int n = 0; n < N; n++)
        for (int j = 0; j < LD; j++)
            if ((j < COL0 || j >= COL0 + OUT) && s[0].y[n * LD + j] != y0[n * LD + j]) outside_kept = 0;
    CHECK_MSG(outside_kept, "lora_forward wrote outside its column slice");
    CHECK(rel_err(s[0].y, y0, N * LD) > 1e-3);  // and did add inside it
    if (!with_dx) CHECK_MSG(!memcmp(s[0].dx, dx0, sizeof dx0), "lora_backward touched dx although it was NULL");
    else CHECK(rel_err(s[0].dx, dx0, N * IN) > 1e-3);
}

TEST(lora_ops_equal_their_composition) { check_against_composition(1); }
TEST(lora_backward_without_dx) { check_against_composition(0); }

TEST_MAIN()
