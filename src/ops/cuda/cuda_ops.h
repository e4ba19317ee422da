// cuda_ops.h: the CUDA backend's C-linkage functions (memory, stream, optimizer passes, init),
// gathered with the templated ops of cuda_ops.cuh into sl_ops_cuda / sl_ops_cuda_bf16 by ops_cuda.cu.
// Every pointer is GPU memory unless it says host; shapes, accumulate/overwrite conventions and
// argument order are exactly those of ops.h. Every op is queued on the backend's stream and returns
// at once, except those returning a value to the host (crossentropy_forward, sumsq, nonfinite),
// which wait for that one value.
#ifndef SHARDLM_CUDA_OPS_H
#define SHARDLM_CUDA_OPS_H

#include <stddef.h>
#include "shardlm/ops.h"

// The ops over activations (encoder .. crossentropy) are C++ templates on the activation storage
// type: cuda_ops.cuh. Here: the GEMMs' compute type and everything that is not storage-typed.
// matmul.cu
void cuda_set_precision(int precision);  // the GEMMs' compute type (ops.h set_precision)
// The bias gradients matmul_backward has queued so far, and (*epilogue) how many of them came from the
// dweight GEMM's BGRADB epilogue rather than the column-sum kernels: for the tests.
unsigned long cuda_matmul_bias_grad_calls(unsigned long *epilogue);
// optimizer.cu (flat-buffer passes of the optimizer step; see ops.h). The argument structs and
// `segs` are host memory.
double cuda_sumsq(const float *g, size_t n);
void cuda_scale(float *x, size_t n, float coef);
void cuda_add(float *x, const float *y, size_t n);
int cuda_nonfinite(const float *x, size_t n);
void cuda_round_to(float *x, size_t n, int precision);
void cuda_to_storage(void *dst, const float *src, size_t n);
void cuda_adam_step(const sl_adam_args *a, float *p, const float *g, float *m, float *v, const sl_segment *segs,
                    int n_segs);
void cuda_sgd_step(const sl_sgd_args *a, float *p, const float *g, float *buf, const sl_segment *segs, int n_segs);

// ops_cuda.cu: memory, stream and errors
int cuda_backend_init(int device);  // selects the GPU, creates the stream and the cuBLASLt handle
int cuda_device_count(void);     // visible GPUs, or -1 with "no usable CUDA GPU: ..."
void *cuda_alloc(size_t bytes, const char *what);
void cuda_dealloc(void *p);
void cuda_memzero(void *p, size_t bytes);
void cuda_upload(void *dst, const void *host_src, size_t bytes);
void cuda_download(void *host_dst, const void *src, size_t bytes);
void cuda_copy(void *dst, const void *src, size_t bytes);
int cuda_synchronize(void);
void *cuda_stream_handle(void);
size_t cuda_peak_bytes(void);
void cuda_reset_peak_bytes(void);

// attention_mma.cu: the mma.sync attention launches queued so far (forward and backward calls), which
// the GPU op tests read to know that SHARDLM_ATTENTION=mma ran those kernels and not a fallback
unsigned long cuda_attention_mma_launches(void);
// The L2 share its SHARDLM_ATTENTION_GRID=heads launches size their chunks of heads to on the current
// device (attention_grid.h sl_grid_l2_share of the device's L2), for the tests to size theirs alike.
size_t cuda_attention_grid_share(void);
// attention_cudnn.cu: the attention calls queued through cuDNN so far (SHARDLM_ATTENTION=cudnn), for the
// tests; and its operation graph for one call built and finalized without a GPU (cuDNN checks the
// graph's structure then): 0 accepted, 1 libcudnn (or its header at build time) missing, -1 refused,
// `why` saying which and cuDNN's message.
unsigned long cuda_attention_cudnn_calls(void);
size_t cuda_attention_cudnn_version(void);  // the libcudnn it loads (9.19.0: 91900), 0 when none
// The plans built so far (each compiles its kernels then), their seconds in all and the longest's.
unsigned long cuda_attention_cudnn_plans(double *seconds, double *longest);
int cuda_attention_cudnn_check_graph(int backward, int deterministic, int B, int T, int NH, int NKV, int HD,
                                     char *why, size_t cap);
// Calls of crossentropy_fused that ran the shared-memory row kernel (SHARDLM_CE_ROW_SMEM=1 or 2), and of
// those the two-row form (=2), for tests.
unsigned long cuda_crossentropy_smem_launches(void);
unsigned long cuda_crossentropy_smem2_launches(void);
// Whether that kernel takes rows of Vp logits (bf16, else fp32) on this GPU, `rows` (1 or 2) rows a
// block: 16-byte vectors, and the rows fit its shared memory (16-byte aligned logits assumed).
int cuda_crossentropy_smem_takes(int Vp, int bf16, int rows);

#endif
