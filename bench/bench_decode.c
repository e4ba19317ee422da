// bench_decode.c: generation speed at batch 1 on one backend. Builds a model from a preset with
// random weights (seeded), prefills a prompt of --prompt tokens as one forward, then decodes --tokens
// tokens one at a time against the KV cache (greedy: the argmax of each step's logits is fed back),
// the path `shardlm generate` takes. Reports prefill and decode tokens/s, the bytes of parameters a
// decoded token reads (every weight once: the layout's bytes in the activation storage the table
// uses), the achieved read rate (bytes x decode tok/s), and, next to it, this machine's read
// bandwidth measured in the same run (the best of several passes summing a 1 GiB buffer with all
// threads). Prints one JSON line.
//
// --profile 1 wraps the table with the profiler (ops_profile.h) and prints its per-op table (both
// runs, prefill and decode together) to stderr; the headline figures then include its overhead.
//
//   bench_decode --model gpt2 [--prompt 128] [--tokens 64] [--threads 2] [--device cpu] [--seed 1]
//                [--profile 0|1]
#include "shardlm/cpu_features.h"
#include "shardlm/error.h"
#include "shardlm/kv_cache.h"
#include "shardlm/model.h"
#include "shardlm/ops.h"
#include "shardlm/ops_profile.h"
#include "shardlm/rng.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// Read bandwidth: the best of 5 passes summing `bytes` of floats with every thread (GB/s).
static double read_bandwidth(size_t bytes) {
    size_t n = bytes / sizeof(float);
    float *x = malloc(n * sizeof(float));
    if (!x) return 0;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] = (float)(i & 7);
    double best = 0, sink = 0;
    for (int pass = 0; pass < 5; pass++) {
        double t0 = now_seconds(), s = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : s)
        for (size_t i = 0; i < n; i++) s += x[i];
        double rate = (double)bytes / (now_seconds() - t0) / 1e9;
        sink += s;
        if (rate > best) best = rate;
    }
    free(x);
    return sink == -1 ? 0 : best;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

int main(int argc, char **argv) {
    const char *preset = "gpt2", *device = "cpu";
    int prompt = 128, tokens = 64, threads = 0, profile = 0;
    unsigned long long seed = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *f = argv[i], *v = argv[i + 1];
        if (!strcmp(f, "--model")) preset = v;
        else if (!strcmp(f, "--device")) device = v;
        else if (!strcmp(f, "--prompt")) prompt = atoi(v);
        else if (!strcmp(f, "--tokens")) tokens = atoi(v);
        else if (!strcmp(f, "--threads")) threads = atoi(v);
        else if (!strcmp(f, "--seed")) seed = strtoull(v, NULL, 10);
        else if (!strcmp(f, "--profile")) profile = atoi(v);
        else {
            fprintf(stderr, "usage: %s [--model PRESET] [--prompt P] [--tokens N] [--threads T] [--device D] [--seed S]\n",
                    argv[0]);
            return 2;
        }
    }
    if ((argc - 1) % 2 || prompt < 1 || tokens < 1) {
        fprintf(stderr, "bench_decode: flags take one value each; --prompt and --tokens must be >= 1\n");
        return 2;
    }
    if (threads > 0) sl_ops_cpu_set_threads(threads);
    sl_model_config cfg;
    const sl_ops *ops = sl_ops_for_device(device, 0);
    if (ops && profile) ops = sl_ops_profile_wrap(ops);
    sl_model m;
    sl_kv_cache kv;
    if (!ops || sl_config_preset(&cfg, preset) || sl_model_create(&m, &cfg, ops) || sl_model_init_weights(&m, seed) ||
        sl_model_params_changed(&m) || sl_kv_cache_init(&kv, &m, prompt + tokens)) {
        fprintf(stderr, "bench_decode: %s\n", sl_error());
        return 1;
    }
    int *ids = malloc(sizeof(int) * (size_t)prompt);
    sl_rng rng = sl_rng_make(seed, 0, 0, SL_RNG_DATA);
    for (int i = 0; i < prompt; i++) ids[i] = (int)sl_rng_below(&rng, (uint64_t)cfg.vocab_size);
    const float *logits = NULL;
    // one untimed run of both phases (first-use costs: GEMM library choice, page faults), then timed
    double t_prefill = 0, t_decode = 0;
    for (int rep = 0; rep < 2; rep++) {
        sl_kv_cache_reset(&kv);
        double t0 = now_seconds();
        if (sl_model_forward_cached(&m, &kv, ids, prompt, &logits)) break;
        double t1 = now_seconds();
        for (int i = 0; i < tokens; i++)
            if (sl_kv_cache_forward(&kv, argmax(logits, cfg.vocab_size), &logits)) break;
        if (ops->synchronize()) break;
        t_prefill = t1 - t0;
        t_decode = now_seconds() - t1;
    }
    if (sl_error()[0] && !logits) {
        fprintf(stderr, "bench_decode: %s\n", sl_error());
        return 1;
    }
    // bytes a decoded token reads: every parameter once (a tied head reads wte once more, counted once)
    double weight_bytes = (double)m.layout.total * (double)(ops->act_bf16 ? 2 : 4);
    double decode_tps = tokens / t_decode, bw = ops->on_device ? 0 : read_bandwidth((size_t)1 << 30);
    char isa[256];
    sl_cpu_features_describe(isa, sizeof isa);
    printf("{\"impl\":\"shardlm-decode\",\"model\":\"%s\",\"device\":\"%s\",\"ops\":\"%s\",\"threads\":%d,"
           "\"prompt\":%d,\"tokens\":%d,\"prefill_tok_s\":%.1f,\"decode_tok_s\":%.2f,\"weight_bytes\":%.0f,"
           "\"decode_read_gb_s\":%.2f,\"machine_read_gb_s\":%.2f,\"cpu_isa\":\"%s\",\"gemm\":\"%s\"}\n",
           preset, device, ops->name, omp_get_max_threads(), prompt, tokens, prompt / t_prefill, decode_tps,
           weight_bytes, weight_bytes * decode_tps / 1e9, bw, isa, ops->on_device ? "device" : sl_cpu_gemm_description());
    if (profile) sl_ops_profile_report(stderr, 1);
    free(ids);
    sl_kv_cache_free(&kv);
    sl_model_free(&m);
    return 0;
}
