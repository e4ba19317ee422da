// attention_tc_call.cuh: what the two tensor-core attention paths for bf16 storage (attention_tc.cu's
// WMMA kernels, attention_mma.cu's mma.sync ones) share on the host: the head dims they are compiled
// for and the dispatch over them, the 16-byte alignment their vector loads need, and whether a block's
// shared memory at a head dim fits what the GPU allows (else the call goes to the next path).
#ifndef SHARDLM_ATTENTION_TC_CALL_CUH
#define SHARDLM_ATTENTION_TC_CALL_CUH

#include "ops/cuda/cuda_common.cuh"

#include <stdint.h>

inline bool att_tc_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

inline bool att_tc_head_dim(int HD) { return HD == 16 || HD == 32 || HD == 64 || HD == 80 || HD == 96 || HD == 128; }

// FN<HD>(...) for a head dim att_tc_head_dim accepts (128 for any other).
#define ATT_TC_DISPATCH(hd, FN, ...)          \
    do {                                      \
        switch (hd) {                         \
        case 16: FN<16>(__VA_ARGS__); break;  \
        case 32: FN<32>(__VA_ARGS__); break;  \
        case 64: FN<64>(__VA_ARGS__); break;  \
        case 80: FN<80>(__VA_ARGS__); break;  \
        case 96: FN<96>(__VA_ARGS__); break;  \
        default: FN<128>(__VA_ARGS__); break; \
        }                                     \
    } while (0)

// Smem<D>::forward, ::dkdv and ::dq are a path's shared-memory bytes per block at head dim D: the
// forward's, or the larger backward kernel's, fits the GPU's opt-in limit (before backend init: true,
// and the launch reports it). H100 allows 227 KiB, A100 163 KiB, sm_86/89 99 KiB: there the largest
// head dims of a path may not fit, and those calls take the next path (mma -> WMMA -> SIMT).
template <template <int> class Smem, int D> void att_tc_smem_fits_at(bool *fits, bool backward) {
    const size_t need = backward ? (Smem<D>::dkdv > Smem<D>::dq ? Smem<D>::dkdv : Smem<D>::dq) : Smem<D>::forward;
    const cudaDeviceProp *p = sl_cuda_device_props();
    *fits = !p || need <= p->sharedMemPerBlockOptin;
}
template <template <int> class Smem> bool att_tc_smem_fits(int HD, bool backward) {
    bool fits = true;
    switch (HD) {
    case 16: att_tc_smem_fits_at<Smem, 16>(&fits, backward); break;
    case 32: att_tc_smem_fits_at<Smem, 32>(&fits, backward); break;
    case 64: att_tc_smem_fits_at<Smem, 64>(&fits, backward); break;
    case 80: att_tc_smem_fits_at<Smem, 80>(&fits, backward); break;
    case 96: att_tc_smem_fits_at<Smem, 96>(&fits, backward); break;
    default: att_tc_smem_fits_at<Smem, 128>(&fits, backward); break;
    }
    return fits;
}

#endif
