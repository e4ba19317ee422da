// gpu_check.h: the PASS / FAIL lines, the tensor comparison and the test adapters shared by the GPU
// model tests (test_model_cuda.c, test_generate_cuda.c). Header-only: each test program is one file.
#ifndef SHARDLM_GPU_CHECK_H
#define SHARDLM_GPU_CHECK_H

#include "shardlm/error.h"
#include "shardlm/lora.h"
#include "shardlm/model.h"
#include "shardlm/ops.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

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

// Adapters on every linear of m (r 4, alpha 16, lora_dropout `dropout`), built on m's backend from
// seed 6 with B made nonzero (PEFT's B = 0 would leave them without effect and every A gradient 0):
// the same weights on every backend. Attached to m (lo owned by the caller: sl_lora_free after m).
// target_modules of attach_test_lora (a check may set another list, e.g. with lm_head).
static const char *test_lora_targets = "all-linear";

static int attach_test_lora(sl_model *m, sl_lora *lo, float dropout) {
    sl_lora_config lc;
    sl_lora_config_defaults(&lc);
    lc.r = 4;
    lc.lora_alpha = 16;
    lc.lora_dropout = dropout;
    if (sl_lora_config_set_targets(&lc, test_lora_targets, "test") || sl_lora_create(lo, &m->cfg, &lc, m->ops) ||
        sl_lora_init_weights(lo, 6))
        return -1;
    float *p = malloc(lo->total * sizeof(float));
    if (!p) return sl_errorf("out of memory");
    m->ops->download(p, lo->params, lo->total * sizeof(float));
    for (size_t i = 0; i < lo->total; i++) p[i] += 0.02f * (float)((int)((i * 7919) % 11) - 5);
    m->ops->upload(lo->params, p, lo->total * sizeof(float));
    free(p);
    return sl_model_attach_lora(m, lo);
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
