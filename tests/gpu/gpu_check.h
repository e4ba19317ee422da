// gpu_check.h: the PASS / FAIL lines and the tensor comparison shared by the GPU model tests
// (test_model_cuda.c, test_generate_cuda.c). Header-only: each test program is one file.
#ifndef SHARDLM_GPU_CHECK_H
#define SHARDLM_GPU_CHECK_H

#include "shardlm/error.h"
#include "shardlm/ops.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>

static int passed, failed;

// Prints "PASS name (fmt)" or "FAIL name (fmt)" with v formatted by fmt, and counts it.
static void report(int ok, const char *name, const char *fmt, double v) {
    printf("%s %s (", ok ? "PASS" : "FAIL", name);
    printf(fmt, v);
    printf(")\n");
    ok ? passed++ : failed++;
}

// max |a - b| relative to the largest |b|.
static double rel_diff(const float *a, const float *b, size_t n) {
    double w = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        w = fmax(w, fabs((double)a[i] - b[i]));
        mx = fmax(mx, fabs((double)b[i]));
    }
    return mx > 0 ? w / mx : w;
}

// The GPU of argv[1] (default cuda:0), stdout line-buffered (a crash keeps the lines printed so far);
// NULL after printing the failure and the totals.
static const sl_ops *gpu_open(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const sl_ops *gpu = sl_ops_for_device(argc > 1 ? argv[1] : "cuda:0", 0);
    if (!gpu) printf("FAIL cuda_backend_available: %s\n0 passed, 1 failed\n", sl_error());
    return gpu;
}

// The last check (no CUDA error recorded by the backend) and the totals line; the exit status.
static int gpu_finish(const sl_ops *gpu) {
    int sync = gpu->synchronize();
    report(sync == 0, "no_cuda_errors_recorded", "exact", 0);
    if (sync) printf("  %s\n", sl_error());
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

#endif
