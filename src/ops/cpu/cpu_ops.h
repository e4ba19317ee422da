// cpu_ops.h: the CPU backend's op functions (OpenBLAS for GEMM, OpenMP + vectorised C for the
// rest), gathered into sl_ops_cpu by ops_cpu.c. Semantics and shapes are documented in ops.h.
// Every op is deterministic for a given thread count; most are deterministic for any.
#ifndef SHARDLM_CPU_OPS_H
#define SHARDLM_CPU_OPS_H

#include "shardlm/ops.h"

// Below this much work (elements touched) an op runs on the calling thread: waking the team costs more.
#define SL_PAR_MIN_WORK ((size_t)32768)

// The ops of ops_list.h, cpu_<op>: fp32 storage, so each converts its sl_act arguments with cpu_f32.
#define SL_CPU_OP_DECL(ret, name, params, args, storage, flops, emulation) ret cpu_##name params;
SL_OPS(SL_CPU_OP_DECL)
#undef SL_CPU_OP_DECL

// The CPU backend's activation storage is float32: an sl_act pointer as the floats it holds, and
// back (const stays const).
#define cpu_f32(p) _Generic((p), sl_act *: (float *)(void *)(p), const sl_act *: (const float *)(const void *)(p))
#define cpu_act(p) _Generic((p), float *: (sl_act *)(void *)(p), const float *: (const sl_act *)(const void *)(p))

// What is not an op over activations (ops_cpu.c), shared by every CPU table (cpu, cpu-bf16, cpu-bf16-onednn): host
// memory (transfers are copies), the precision switch (nothing: OpenBLAS is fp32) and the optimizer
// step's passes over flat fp32 buffers.
void *cpu_alloc(size_t bytes, const char *what);
void cpu_dealloc(void *p);
void cpu_memzero(void *p, size_t bytes);
void cpu_copy(void *dst, const void *src, size_t bytes);
int cpu_synchronize(void);
void *cpu_stream(void);
size_t cpu_peak_bytes(void);
void cpu_reset_peak_bytes(void);
void cpu_scale(float *x, size_t n, float coef);
void cpu_add(float *x, const float *y, size_t n);
// optimizer.c: the optimizer passes (ops.h adam_step, sgd_step, sumsq, nonfinite)
void cpu_adam_step(const sl_adam_args *a, float *p, const float *g, float *m, float *v, const sl_segment *segs,
                   int n_segs);
void cpu_sgd_step(const sl_sgd_args *a, float *p, const float *g, float *buf, const sl_segment *segs, int n_segs);
// optimizer_8bit.c: 8-bit AdamW (ops.h adam8_step)
void cpu_adam8_step(const sl_adam8_args *a, float *p, const float *g, const sl_adam8_state *st,
                    const sl_adam8_segment *segs, int n_segs, sl_adam8_edges *edges, int measure);
double cpu_sumsq(const float *g, size_t n);
int cpu_nonfinite(const float *g, size_t n);
void cpu_set_precision(int precision);
void cpu_round_to(float *x, size_t n, int precision);
void cpu_to_storage(void *dst, const float *src, size_t n);
// Those entries of a CPU table (designated initialisers).
#define SL_CPU_HOST_FNS                                                                                 \
    .set_precision = cpu_set_precision, .on_device = 0, .alloc = cpu_alloc, .dealloc = cpu_dealloc,     \
    .memzero = cpu_memzero, .upload = cpu_copy, .download = cpu_copy, .copy = cpu_copy,                 \
    .stream = cpu_stream, .peak_bytes = cpu_peak_bytes,                 \
    .reset_peak_bytes = cpu_reset_peak_bytes, .sumsq = cpu_sumsq, .scale = cpu_scale, .add = cpu_add,   \
    .nonfinite = cpu_nonfinite, .round_to = cpu_round_to, .to_storage = cpu_to_storage,                 \
    .adam_step = cpu_adam_step, .sgd_step = cpu_sgd_step, .adam8_step = cpu_adam8_step
// The entry of op `name` of ops_list.h in a CPU table: cpu_<name> (SL_OPS(SL_CPU_OP_ENTRY) fills them all).
#define SL_CPU_OP_ENTRY(ret, name, params, args, storage, flops, emulation) .name = cpu_##name,

// gemm.c: C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C, row-major, op(X) = X^T when its flag
// is set; OpenBLAS or oneDNN, chosen once (see gemm.c and sl_cpu_gemm_description).
void cpu_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
               float beta, float *C, int ldc);
// The two libraries behind it, same arguments (tests run both).
void cpu_gemm_openblas(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc);
void cpu_gemm_onednn(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                     int ldb, float beta, float *C, int ldc);

// gemv.c: y (OC) = W (OC,IC) @ x (IC) (+ bias, may be NULL): a linear layer at one row (matmul_forward
// with N = 1), memory-bound; a fixed summation order, the same bits for any thread count.
void cpu_gemv_f32(float *y, const float *W, const float *x, const float *bias, int OC, int IC);

// An op of a CPU table that fails (no memory for scratch, a failing library call) records sl_error()'s
// message with the op's name; later ops run on, and every CPU table's synchronize() reports the first
// failure and clears it (as a failed GPU call is reported; the engine checks it every step).
void cpu_record_failure(const char *op);

// One row of RMSNorm's input gradient, dx (C) += ..., out of line (norm.c): the fp32 op and the bf16
// table's in-place one (norm_bf16.c) run the same code on the same values.
void cpu_rmsnorm_backward_row(float *dx, const float *dy, const float *x, const float *w, float r, int C);
// dw (n) += dy * x * r elementwise: one row's share of RMSNorm's weight gradient (norm.c; shared the same way).
void cpu_rmsnorm_weight_grad_row(float *dw, const float *dy, const float *x, float r, int n);

// Splits [0, n) into the calling thread's contiguous share inside an omp parallel region.
void cpu_thread_range(size_t n, size_t *begin, size_t *end);

#endif
