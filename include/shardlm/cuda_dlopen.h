// cuda_dlopen.h: finding CUDA's shared libraries at run time. Nothing in shardlm links against
// CUDA; the NCCL backend and `shardlm report` dlopen libcudart / libnccl / libcuda instead, so one
// binary runs on machines with and without a GPU.
#ifndef SHARDLM_CUDA_DLOPEN_H
#define SHARDLM_CUDA_DLOPEN_H

#include <stddef.h>

// dlopen's (RTLD_NOW | RTLD_LOCAL) the first of the NULL-terminated `names` found in the build's CUDA
// library directory (SHARDLM_CUDA_LIBDIR, default /usr/local/cuda/lib64), then $CUDA_HOME/lib64,
// then the loader's search path. NULL when none loads; `why` then holds the loader's message for
// the first name.
void *sl_cuda_dlopen(const char *const *names, char *why, size_t cap);

// libcudnn (cuDNN 9): the file SHARDLM_CUDNN_LIBRARY names when it is set (only that file: a machine
// may hold several cuDNN versions, e.g. the toolkit's and a newer one in the nvidia-cudnn wheel, and
// that library loads its engine libraries from its own folder), else libcudnn.so.9 / libcudnn.so by
// sl_cuda_dlopen's search. NULL when none loads; `why` then says which file and why.
void *sl_cudnn_dlopen(char *why, size_t cap);

#endif
