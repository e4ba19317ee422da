// cpu_bf16.h: the pieces of sl_ops_cpu_bf16_native ("cpu-bf16-onednn"), real bf16 activation storage
// on the CPU (ops.h act_bf16 = 1): oneDNN's bf16 matmul (onednn_matmul.c), the linear layers built on it
// (matmul_bf16.c) and the table with its staged ops, scratch buffers and failure record
// (ops_cpu_bf16_native.c). docs/precision.md says which runs use it.
#ifndef SHARDLM_CPU_BF16_H
#define SHARDLM_CPU_BF16_H

#include "ops/cpu/cpu_ops.h"
#include "shardlm/precision.h"

#include <stdio.h>

// bf16 storage as the sl_bf16 values it holds.
static inline sl_bf16 *bf16_of(sl_act *p) { return (sl_bf16 *)(void *)p; }
static inline const sl_bf16 *cbf16_of(const sl_act *p) { return (const sl_bf16 *)(const void *)p; }

// onednn_matmul.c: C (M,N) = op(A) (M,K) @ op(B) (K,N) (+ bias (N)), row-major as cpu_sgemm (op(X) = X^T
// when its flag is set; ldc = N), A and B bf16, fp32 accumulation; C is bf16 (c_f32 = 0: rounded to
// nearest even once) or fp32 (c_f32 = 1), accumulated into with accumulate = 1 (C += ...).
// bias may be NULL. Deterministic for a given shape and thread count. 0, or -1 with a message naming
// op and the shape (a failing oneDNN call).
int cpu_gemm_bf16(const char *op, int ta, int tb, int M, int N, int K, const sl_bf16 *A, int lda, const sl_bf16 *B,
                  int ldb, const sl_bf16 *bias, void *C, int c_f32, int accumulate);
// C (M,N; rows ldc apart, so a column slice of a wider matrix) = alpha op(A) @ op(B), or += with
// accumulate = 1 (the sum in fp32, rounded once for a bf16 C); no bias. 0, or -1 as cpu_gemm_bf16.
int cpu_gemm_bf16_scaled(const char *op, int ta, int tb, int M, int N, int K, float alpha, const sl_bf16 *A, int lda,
                         const sl_bf16 *B, int ldb, void *C, int ldc, int c_f32, int accumulate);
// The same product on the calling thread alone, for the threads of an OpenMP parallel region to run
// theirs at once (per-thread primitives and stream, no lock): the same bits for any thread count.
int cpu_gemm_bf16_serial(const char *op, int ta, int tb, int M, int N, int K, const sl_bf16 *A, int lda,
                         const sl_bf16 *B, int ldb, const sl_bf16 *bias, void *C, int c_f32, int accumulate);
// cpu_gemm_bf16_scaled on the calling thread alone (as cpu_gemm_bf16_serial).
int cpu_gemm_bf16_scaled_serial(const char *op, int ta, int tb, int M, int N, int K, float alpha, const sl_bf16 *A,
                                int lda, const sl_bf16 *B, int ldb, void *C, int ldc, int c_f32, int accumulate);
// The name of the kernel oneDNN picks for a bf16 linear layer on this CPU ("brg:avx512_core_bf16", or
// "ref:any" where it has no bf16 code for it) into impl; 0, or -1 with a message.
int cpu_gemm_bf16_kernel(char *impl, size_t cap);

// gemv.c: y (OC, fp32) = W (OC,IC) @ x (IC) (+ bias) on bf16 operands with fp32 accumulation, for the
// linear layers at one row: vdpbf16ps where the CPU has AVX512_BF16, a portable loop with the same
// summation order otherwise (equal but for denormals, which vdpbf16ps flushes). cpu_gemv_bf16_path picks
// the portable loop with native = 0 (the tests compare both); cpu_gemv_bf16_native says whether the
// vdpbf16ps kernel runs here.
void cpu_gemv_bf16(float *y, const sl_bf16 *W, const sl_bf16 *x, const sl_bf16 *bias, int OC, int IC);
void cpu_gemv_bf16_path(float *y, const sl_bf16 *W, const sl_bf16 *x, const sl_bf16 *bias, int OC, int IC,
                        int native);
int cpu_gemv_bf16_native(void);

// matmul_bf16.c: the GEMM ops of ops_list.h on bf16 storage, their contracts as ops.h states them.
void cpu_bf16_matmul_forward(sl_act *out, const sl_act *inp, const sl_act *weight, const sl_act *bias, int N, int IC,
                             int OC);
void cpu_bf16_matmul_backward(sl_act *dinp, float *dweight, float *dbias, const sl_act *dout, const sl_act *inp,
                              const sl_act *weight, int N, int IC, int OC);
void cpu_bf16_matmul_gelu_forward(sl_act *out, sl_act *pre, const sl_act *inp, const sl_act *weight,
                                  const sl_act *bias, int N, int IC, int OC);

// lora_bf16.c: lora_forward / lora_backward on bf16 storage as four oneDNN bf16 matmuls (the adapter
// output added in the second, the scale an output scale); their contracts as ops.h states them.
void cpu_bf16_lora_forward(sl_act *y, sl_act *u, sl_act *delta, const sl_act *x, const sl_act *A, const sl_act *B,
                           float scale, int N, int in, int r, int out, int ld, int col0);
void cpu_bf16_lora_backward(sl_act *dx, float *dA, float *dB, sl_act *du, sl_act *delta, sl_act *dh, const sl_act *dy,
                            const sl_act *x, const sl_act *u, const sl_act *A, const sl_act *B, float scale, int N,
                            int in, int r, int out, int ld, int col0);
// Tests: 1 makes lora_forward take its blocked slice update for every column slice, as on CPUs with
// AMX (0: by the CPU, the default).
void cpu_bf16_lora_force_slice_blocks(int on);

// norm_bf16.c: rmsnorm_backward on bf16 storage in place, with the staged op's bits (its contract as
// ops.h states it).
void cpu_bf16_rmsnorm_backward(sl_act *dinp, float *dw, const sl_act *dout, const sl_act *inp, const sl_act *w,
                               const float *rstd, int N, int C);

// attention_decode.c: attention_decode on bf16 storage, the cache read (and widened) in place: the
// staged op's bits, without staging the cache.
void cpu_bf16_attention_decode(sl_act *out, const sl_act *q, const sl_act *k_cache, const sl_act *v_cache,
                               int n_ctx, int NH, int NKV, int HD);

// attention_bf16.c: attention_forward / attention_backward on bf16 storage with every product a oneDNN
// bf16 matmul (P and dS rounded to bf16 before their products); their contracts as ops.h states them.
void cpu_bf16_attention_forward(sl_act *out, float *lse, const sl_act *qkv, int B, int T, int NH, int NKV, int HD,
                                int window);
void cpu_bf16_attention_backward(sl_act *dqkv, const sl_act *dout, const sl_act *qkv, const sl_act *out,
                                 const float *lse, int B, int T, int NH, int NKV, int HD, int window);

// elementwise_bf16.c: residual_forward, GELU, SwiGLU, RoPE, add_columns and take_columns on bf16 storage in place, with the
// staged ops' bits (their contracts as ops.h states them).
void cpu_bf16_residual_forward(sl_act *out, const sl_act *a, const sl_act *b, size_t n);
void cpu_bf16_add_columns(sl_act *out, const sl_act *inp, float scale, int N, int W, int ld, int col0);
void cpu_bf16_take_columns(sl_act *out, const sl_act *inp, float scale, int N, int W, int ld, int col0);
void cpu_bf16_gelu_forward(sl_act *out, const sl_act *inp, size_t n);
void cpu_bf16_gelu_backward(sl_act *dinp, const sl_act *inp, const sl_act *dout, size_t n);
void cpu_bf16_swiglu_forward(sl_act *out, const sl_act *inp, int N, int I);
void cpu_bf16_swiglu_backward(sl_act *dinp, const sl_act *inp, const sl_act *dout, int N, int I);
void cpu_bf16_rope_forward(sl_act *qkv, const float *cos_t, const float *sin_t, int B, int T, int NH, int NKV, int HD,
                           int pos0);
void cpu_bf16_rope_backward(sl_act *dqkv, const float *cos_t, const float *sin_t, int B, int T, int NH, int NKV,
                            int HD);

// The first failure of an OpenMP parallel region, kept by the thread that met it (sl_error()'s message
// is per thread) until the region is over and report() records it for synchronize().
typedef struct {
    int failed;
    char message[320];
} cpu_bf16_region_failure;

static inline void cpu_bf16_region_fail(cpu_bf16_region_failure *f, const char *what) {
#pragma omp critical(cpu_bf16_region_failure)
    if (!f->failed) {
        snprintf(f->message, sizeof f->message, "%s", what);
#pragma omp atomic write
        f->failed = 1;
    }
}

static inline int cpu_bf16_region_failed(cpu_bf16_region_failure *f) {
    int v;
#pragma omp atomic read
    v = f->failed;
    return v;
}

// ops_cpu_bf16_native.c: an op that fails (oneDNN, or no memory for scratch) records sl_error()'s
// message; later ops do nothing until synchronize() reports the first failure and clears it.
void cpu_bf16_record_failure(void);
int cpu_bf16_failed(void);
// After a parallel region: f's failure, if any, as sl_error()'s message and recorded.
void cpu_bf16_region_report(const cpu_bf16_region_failure *f);
// fp32 scratch buffer number slot (0 .. CPU_BF16_SLOTS-1) of at least n floats, kept and grown across
// calls (its contents are not kept); NULL with the failure recorded when the heap is out.
#define CPU_BF16_SLOTS 8
float *cpu_bf16_scratch(int slot, size_t n);

#endif
