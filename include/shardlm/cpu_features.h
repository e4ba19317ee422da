// cpu_features.h: what the CPU backend runs on: the instruction sets this CPU and its operating system
// support (cpuid and xgetbv, read once), and the fp32 GEMM library the backend chose for it. Shown
// by `shardlm report`, the training start-up lines and the benchmarks.
#ifndef SHARDLM_CPU_FEATURES_H
#define SHARDLM_CPU_FEATURES_H

#include <stddef.h>

typedef struct {
    char vendor[13];   // "GenuineIntel", "AuthenticAMD", ... ("" off x86)
    int family, model; // display family and model
    int avx2, fma, avx512f, avx512bw, avx512vl, avx512_vnni, avx512_bf16, avx512_fp16, amx_bf16, amx_int8;
} sl_cpu_features;

// Detected once; every flag is 0 where the CPU or the OS (its saved register state) lacks it.
const sl_cpu_features *sl_cpu_features_get(void);

// "avx2 fma avx512f ... amx_bf16": the supported flags of the list above, in that order ("none").
void sl_cpu_features_describe(char *buf, size_t cap);

// The instruction sets this binary was compiled to use (the build's -march) that the running CPU or OS
// lacks, space-separated; "" when it has them all. A binary built with -march=native on one machine
// and started on a CPU without, say, AVX-512 would die of SIGILL in the first vectorised loop.
const char *sl_cpu_missing_build_isa(void);

// The fp32 GEMM library the CPU backend uses and why, e.g. "OpenBLAS 0.3.21 (Cooperlake kernels)" or
// "oneDNN 2.6.3 sgemm (OpenBLAS 0.3.21 (Prescott kernels) would not use this CPU's AVX2)". Chosen on
// first use by a fixed rule (gemm.c), so every run and rank on a machine takes the same library.
const char *sl_cpu_gemm_description(void);

// Both libraries' rate (GFLOP/s, best of 3) on a linear layer's forward and weight-gradient products,
// with the current thread count: what `shardlm report` shows next to the choice. About 50 ms.
void sl_cpu_gemm_measure(double *openblas, double *onednn);

#endif
