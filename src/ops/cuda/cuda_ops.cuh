// cuda_ops.cuh: the CUDA backend's ops over activations, C++ templates on the activation storage
// type floatX: float for sl_ops_cuda, __nv_bfloat16 for sl_ops_cuda_bf16 (ops.h act_bf16). The
// prototypes are ops.h's, float * throughout; an op reads its storage-typed arguments (ops.h lists
// them) as floatX and its fp32 ones (parameters read elementwise, parameter gradients, statistics)
// as float. Every pointer is GPU memory; every op is queued on sl_cuda_stream() and returns at once,
// except crossentropy_forward, which waits for the loss it returns. Each .cu file defines its ops
// and instantiates them for both types (SL_CUDA_STORAGE_INSTANCES, at its end); ops_cuda.cu takes
// their addresses for the two tables.
#ifndef SHARDLM_CUDA_OPS_CUH
#define SHARDLM_CUDA_OPS_CUH

#include <cuda_bf16.h>
#include <stddef.h>

extern "C" {
#include "shardlm/ops.h"
}

// The two storage types every templated op is compiled for (explicit instantiations of op `fn`).
#define SL_CUDA_STORAGE_INSTANCES(fn) \
    template decltype(fn<float>) fn<float>; \
    template decltype(fn<__nv_bfloat16>) fn<__nv_bfloat16>;

// The ops of ops_list.h, cuda_<op><floatX>, defined in encoder.cu, matmul.cu (cuBLASLt), norm.cu,
// elementwise.cu, rope.cu, attention.cu (fused causal flash attention) and crossentropy.cu (fused
// classifier).
#define SL_CUDA_OP_DECL(ret, name, params, args, storage, flops, emulation) \
    template <typename floatX>                                              \
    ret cuda_##name params;
SL_OPS(SL_CUDA_OP_DECL)
#undef SL_CUDA_OP_DECL

#endif
