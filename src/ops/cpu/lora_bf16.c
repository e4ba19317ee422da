// lora_bf16.c: the LoRA ops of ops_list.h on cpu-bf16-onednn (bf16 activations, the adapters' bf16
// weight shadow) as four oneDNN bf16 matmuls, the scale as a product's output scale, each output
// rounded to bf16 once: u = x A^T; y[:, slice] += scale u B^T; du = scale g B, dB += scale g^T u
// (g the output gradient's slice), dA += du^T x, dx += du A. The composition the emulation and the
// GPU run (ops/lora_compose.h) also stores u B^T, the scaled gradient slice and du A rounded to bf16
// and passes over them again; here nothing but u and du is stored (the backward needs them), so y,
// dx and the adapter gradients carry fewer roundings: the same values within bf16 rounding, not the
// same bits (tests/unit/test_lora_bf16.c bounds each output by its one rounding).
//
// oneDNN 2.6 runs a product through its fast kernels (brgemm, AMX where the CPU has it) only when its
// operands and output are dense; a column slice of a fused output (LLaMA's q/k/v in the qkv
// activation, gate/up in gate|up) sends it to a generic kernel that output scales slow down 4-10x
// (measured on an AMX Xeon: y += scale u B^T into a 768-column slice of 2304, 1.28 ms against
// 0.20 ms dense). So a slice that is not a whole row is made dense first: the gradient slice is
// copied exactly into scratch (no scaling, no rounding), and the forward's product goes, a block of
// rows at a time, to fp32 scratch that is added into y's slice at once, rounding once, as the sum
// post-op does for a whole row. Without AMX the generic kernel is the faster way for the forward's
// product (slice_in_place below), so there it goes straight into the slice.
// A and B gradients stay fp32 and accumulate.
#include "ops/cpu/cpu_bf16.h"
#include "shardlm/cpu_features.h"
#include "shardlm/error.h"

#include <omp.h>
#include <string.h>

#define BF16(p) ((const sl_bf16 *)(const void *)(p))

// y[:, col0:col0+out] (rows ld apart) += scale * u @ B^T for a slice that is not whole rows: blocks of
// SLICE_ROWS rows, each one thread's, its product into that thread's dense fp32 scratch (64 x out: in L2)
// and added into y's slice at once, rounding once. A block's rows get the same bits whichever thread
// takes it, so the result does not depend on the thread count.
#define SLICE_ROWS 64

static void slice_update(sl_bf16 *y, const sl_bf16 *u, const sl_bf16 *B, float scale, int N, int r, int out, int ld,
                         int col0) {
    int blocks = (N + SLICE_ROWS - 1) / SLICE_ROWS, threads = omp_get_max_threads();
    float *scratch = cpu_bf16_scratch(0, (size_t)threads * SLICE_ROWS * out);
    if (!scratch) return;
    cpu_bf16_region_failure f = {0};
#pragma omp parallel for schedule(static) if(blocks > 1)
    for (int b = 0; b < blocks; b++) {
        if (cpu_bf16_region_failed(&f)) continue;
        int n0 = b * SLICE_ROWS, rows = N - n0 < SLICE_ROWS ? N - n0 : SLICE_ROWS;
        float *t = scratch + (size_t)omp_get_thread_num() * SLICE_ROWS * out;
        if (cpu_gemm_bf16_scaled_serial("lora_forward (y)", 0, 1, rows, out, r, scale, u + (size_t)n0 * r, r, B, r, t,
                                        out, 1, 0)) {
            cpu_bf16_region_fail(&f, sl_error());
            continue;
        }
        for (int i = 0; i < rows; i++) {
            sl_bf16 *o = y + (size_t)(n0 + i) * ld + col0;
            const float *d = t + (size_t)i * out;
#pragma omp simd
            for (int j = 0; j < out; j++) o[j] = sl_bf16_round(sl_bf16_widen(o[j]) + d[j]);
        }
    }
    cpu_bf16_region_report(&f);
}

// 1 when the forward's product goes straight into a column slice (ld > out) through oneDNN's strided
// kernel (gemm:jit): on AVX512_BF16 CPUs without AMX it is the faster way (an AMD EPYC Zen 4, 2 threads:
// 0.12 ms at N=1024, out=768, ld=2304 against 0.16 ms through slice_update; 0.30 against 0.52 ms at
// out=2048, ld=4096), while on AMX CPUs that kernel is 4-10x slower than AMX on dense operands (above).
// A fixed rule by the CPU, so a machine always takes the same way (the same bits run to run).
static int force_blocks;  // cpu_bf16_lora_force_slice_blocks: tests take slice_update on any CPU

void cpu_bf16_lora_force_slice_blocks(int on) { force_blocks = on; }

static int slice_in_place(void) { return !force_blocks && !sl_cpu_features_get()->amx_bf16; }

void cpu_bf16_lora_forward(sl_act *y_, sl_act *u, sl_act *delta, const sl_act *x, const sl_act *A, const sl_act *B,
                           float scale, int N, int in, int r, int out, int ld, int col0) {
    (void)delta;
    if (cpu_bf16_failed()) return;
    sl_bf16 *y = bf16_of(y_);
    // u (N,r) = x @ A^T
    if (cpu_gemm_bf16("lora_forward (u)", 0, 1, N, r, in, BF16(x), in, BF16(A), in, NULL, u, 0, 0)) {
        cpu_bf16_record_failure();
        return;
    }
    if (ld == out || slice_in_place()) {  // y[:, slice] += scale * u @ B^T, summed and rounded by the product
        if (cpu_gemm_bf16_scaled("lora_forward (y)", 0, 1, N, out, r, scale, BF16(u), r, BF16(B), r, y + col0, ld, 0, 1))
            cpu_bf16_record_failure();
        return;
    }
    slice_update(y, BF16(u), BF16(B), scale, N, r, out, ld, col0);
}

// The output gradient's slice as a dense (N,out) matrix: dy itself when the slice is whole rows, else
// an exact copy in scratch slot 1; NULL with the failure recorded when the heap is out.
static const sl_bf16 *dense_slice(const sl_bf16 *dy, int N, int out, int ld, int col0) {
    if (ld == out) return dy;
    sl_bf16 *g = (sl_bf16 *)(void *)cpu_bf16_scratch(1, ((size_t)N * out + 1) / 2);
    if (!g) return NULL;
#pragma omp parallel for schedule(static) if((size_t)N * out >= SL_PAR_MIN_WORK)
    for (int n = 0; n < N; n++) memcpy(g + (size_t)n * out, dy + (size_t)n * ld + col0, sizeof(sl_bf16) * (size_t)out);
    return g;
}

// dB (out,r) += scale * g^T @ u, as its transpose: dBt (r,out) = scale * u^T @ g into fp32 scratch, then
// added into dB. oneDNN reads the large g untransposed that way (on an AMD EPYC Zen 4, 2 threads:
// 0.55 -> 0.30 ms at N=1024, out=768; 0.77 -> 0.52 ms at out=2048); the sum over N is the same fp32
// accumulation, added to dB once.
static int adapter_b_grad(float *dB, const sl_bf16 *g, const sl_bf16 *u, float scale, int N, int r, int out) {
    float *dBt = cpu_bf16_scratch(2, (size_t)r * out);
    if (!dBt) return -1;
    if (cpu_gemm_bf16_scaled("lora_backward (dB)", 1, 0, r, out, N, scale, u, r, g, out, dBt, out, 1, 0)) return -1;
    for (int i = 0; i < out; i++)
        for (int j = 0; j < r; j++) dB[(size_t)i * r + j] += dBt[(size_t)j * out + i];
    return 0;
}

void cpu_bf16_lora_backward(sl_act *dx, float *dA, float *dB, sl_act *du, sl_act *delta, sl_act *dh, const sl_act *dy,
                            const sl_act *x, const sl_act *u, const sl_act *A, const sl_act *B, float scale, int N,
                            int in, int r, int out, int ld, int col0) {
    (void)delta;
    (void)dh;
    if (cpu_bf16_failed()) return;
    const sl_bf16 *g = dense_slice(BF16(dy), N, out, ld, col0);
    // dB (out,r) += scale * g^T @ u; du (N,r) = scale * g @ B; dA (r,in) += du^T @ x; dx (N,in) += du @ A
    if (!g || adapter_b_grad(dB, g, BF16(u), scale, N, r, out) ||
        cpu_gemm_bf16_scaled("lora_backward (du)", 0, 0, N, r, out, scale, g, out, BF16(B), r, du, r, 0, 0) ||
        cpu_gemm_bf16("lora_backward (dA)", 1, 0, r, in, N, BF16(du), r, BF16(x), in, NULL, dA, 1, 1) ||
        (dx && cpu_gemm_bf16("lora_backward (dx)", 0, 0, N, in, r, BF16(du), r, BF16(A), in, NULL, dx, 0, 1)))
        cpu_bf16_record_failure();
}
