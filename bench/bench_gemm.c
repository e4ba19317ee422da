// bench_gemm.c: the GEMM rate of shardlm's own matmul_forward on one backend (the CUDA backend's
// cuBLASLt path, or the cpu's GEMM library: SHARDLM_GEMM=openblas|onednn measures each), for the MFU denominator next to torch.matmul's rate
// (bench/torch_gpu.py --gemm). out (N,OC) = inp (N,IC) @ weight^T (OC,IC), no bias, on buffers
// holding random values in [-1, 1) (never zeros: a product of zeros runs faster than real data).
// The buffers are those a training run at --precision would use (--storage train, the default):
// bf16 under --precision bf16 where the device has a bf16-storage table (cuda-bf16: bf16 A, B and
// D; cpu-bf16-onednn: oneDNN's bf16 matmul), fp32 otherwise. --storage fp32 keeps fp32 buffers and
// only sets the compute type (cuda: fp32 -> CUBLAS_COMPUTE_32F, or TF32 with SHARDLM_TF32=1; bf16 ->
// CUBLAS_COMPUTE_32F_FAST_16BF; fp16 -> ..._FAST_16F). Each of --repeats products is timed alone
// (synchronize before reading the clock) after --warmup untimed ones; prints one JSON line with the
// median and best rate and the storage measured.
//
//   bench_gemm --device cuda --precision bf16 [--storage train|fp32] [--size 8192]
//              [--n N --ic IC --oc OC] [--repeats 30] [--warmup 5] [--threads T]
#include "shardlm/cpu_features.h"
#include "shardlm/error.h"
#include "shardlm/ops.h"
#include "shardlm/precision.h"
#include "shardlm/rng.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

// A storage buffer of n random values in [-1, 1) on the device: uploaded as fp32, then converted to
// bf16 storage by the table's own to_storage when it stores bf16.
static void *random_buffer(const sl_ops *ops, size_t n, uint64_t stream, const char *what) {
    float *host = malloc(n * sizeof(float));
    float *dev32 = host ? ops->alloc(n * sizeof(float), what) : NULL;
    void *dev = dev32;
    if (host && dev32) {
        sl_rng rng = sl_rng_make(1234, 0, stream, SL_RNG_DATA);
        for (size_t i = 0; i < n; i++) host[i] = (float)sl_rng_below(&rng, 1u << 24) / (float)(1u << 23) - 1.0f;
        ops->upload(dev32, host, n * sizeof(float));
        if (ops->act_bf16) {
            dev = ops->alloc(n * sizeof(sl_bf16), what);
            if (dev) ops->to_storage(dev, dev32, n);
        }
        if (ops->synchronize()) dev = NULL;   // the upload must finish before host is freed
        if (dev != dev32) ops->dealloc(dev32);
    }
    if (!host) sl_errorf("out of host memory for %s", what);
    free(host);
    return dev;
}

static int positive(const char *flag, const char *v, int *out) {
    char *end;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || x < 1 || x > 1 << 20) {
        fprintf(stderr, "bench_gemm: %s expects a positive integer, got '%s'\n", flag, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

int main(int argc, char **argv) {
    const char *device = "cuda", *prec_name = "bf16", *storage = "train";
    int N = 8192, IC = 8192, OC = 8192, repeats = 30, warmup = 5, threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!v) rc = -1;
        else if (!strcmp(f, "--device")) device = v;
        else if (!strcmp(f, "--precision")) prec_name = v;
        else if (!strcmp(f, "--storage")) rc = strcmp(v, "train") && strcmp(v, "fp32") ? -1 : (storage = v, 0);
        else if (!strcmp(f, "--size")) rc = positive(f, v, &N) || positive(f, v, &IC) || positive(f, v, &OC);
        else if (!strcmp(f, "--n")) rc = positive(f, v, &N);
        else if (!strcmp(f, "--ic")) rc = positive(f, v, &IC);
        else if (!strcmp(f, "--oc")) rc = positive(f, v, &OC);
        else if (!strcmp(f, "--repeats")) rc = positive(f, v, &repeats);
        else if (!strcmp(f, "--warmup")) rc = positive(f, v, &warmup);
        else if (!strcmp(f, "--threads")) rc = positive(f, v, &threads);
        else rc = -1;
        if (rc) {
            fprintf(stderr, "usage: %s [--device cpu|cuda|cuda:N] [--precision fp32|bf16|fp16] [--storage train|fp32] "
                            "[--size S | --n N "
                            "--ic IC --oc OC] [--repeats R] [--warmup W] [--threads T]\n", argv[0]);
            return 2;
        }
        i++;
    }
    int precision = !strcmp(prec_name, "fp32") ? SL_PRECISION_FP32
                    : !strcmp(prec_name, "bf16") ? SL_PRECISION_BF16
                    : !strcmp(prec_name, "fp16") ? SL_PRECISION_FP16 : -1;
    if (precision < 0) { fprintf(stderr, "bench_gemm: --precision expects fp32, bf16 or fp16\n"); return 2; }
    if (threads > 0) sl_ops_cpu_set_threads(threads);

    const sl_ops *ops = sl_ops_for_device(device, 0);
    if (!ops) { fprintf(stderr, "bench_gemm: %s\n", sl_error()); return 1; }
    if (!strcmp(storage, "train")) ops = sl_ops_for_precision(ops, precision);
    ops->set_precision(precision);
    size_t elem = ops->act_bf16 ? sizeof(sl_bf16) : sizeof(float);
    sl_act *inp = random_buffer(ops, (size_t)N * IC, 1, "gemm input");
    sl_act *weight = inp ? random_buffer(ops, (size_t)OC * IC, 2, "gemm weight") : NULL;
    sl_act *out = weight ? ops->alloc((size_t)N * OC * elem, "gemm output") : NULL;
    double *t = malloc(sizeof(double) * (size_t)repeats);
    if (!out || !t) { fprintf(stderr, "bench_gemm: %s\n", t ? sl_error() : "out of host memory"); return 1; }

    for (int i = 0; i < warmup; i++) ops->matmul_forward(out, inp, weight, NULL, N, IC, OC);
    if (ops->synchronize()) { fprintf(stderr, "bench_gemm: %s\n", sl_error()); return 1; }
    for (int i = 0; i < repeats; i++) {
        double t0 = now_seconds();
        ops->matmul_forward(out, inp, weight, NULL, N, IC, OC);
        if (ops->synchronize()) { fprintf(stderr, "bench_gemm: %s\n", sl_error()); return 1; }
        t[i] = now_seconds() - t0;
    }
    qsort(t, (size_t)repeats, sizeof(double), cmp_double);
    double median = repeats % 2 ? t[repeats / 2] : 0.5 * (t[repeats / 2 - 1] + t[repeats / 2]);
    double flops = 2.0 * N * (double)IC * OC;
    const char *tf32 = getenv("SHARDLM_TF32");
    printf("{\"impl\":\"shardlm-gemm\",\"device\":\"%s\",\"ops\":\"%s\",\"precision\":\"%s\",\"storage\":\"%s\",\"shardlm_tf32\":\"%s\","
           "\"N\":%d,\"IC\":%d,\"OC\":%d,\"repeats\":%d,\"warmup\":%d,\"ms_median\":%.4f,\"ms_min\":%.4f,"
           "\"tflops_median\":%.4f,\"tflops_best\":%.4f,\"library\":\"%s\"}\n",
           device, ops->name, prec_name, ops->act_bf16 ? "bf16" : "fp32", tf32 ? tf32 : "", N, IC, OC, repeats, warmup, 1e3 * median, 1e3 * t[0],
           flops / median / 1e12, flops / t[0] / 1e12, ops->on_device                          ? "device"
           : !strcmp(ops->name, "cpu-bf16-onednn") ? "oneDNN bf16 matmul"
                                                   : sl_cpu_gemm_description());
    free(t);
    ops->dealloc(out);
    ops->dealloc(weight);
    ops->dealloc(inp);
    return 0;
}
