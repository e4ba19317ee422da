// bench_decode.c: generation speed at batch 1 on one backend. Builds a model from a preset, a
// config.json or a Hugging Face directory's config.json (sl_model_source_resolve) with random weights
// (seeded; speed does not depend on their values), prefills a prompt of --prompt tokens as one forward, then decodes --tokens
// tokens one at a time against the KV cache (greedy: the argmax of each step's logits is fed back),
// the path `shardlm generate` takes. Reports prefill and decode tokens/s, the bytes of parameters a
// decoded token reads (every weight once: the layout's bytes in the activation storage the table
// uses), the achieved read rate (bytes x decode tok/s), and, next to it, this machine's read
// bandwidth measured in the same run (the best of several passes summing a 1 GiB buffer with all
// threads), and the kernel's transparent huge page mode ("thp"). Prints one JSON line.
//
// --precision bf16 runs the table a bf16 run gets (sl_ops_for_precision: cpu-bf16-onednn where the CPU
// has bf16 instructions): weights and activations in bf16, so a decoded token reads half the bytes.
// --repeats R times R prefill + decode runs after one untimed one and reports the median of each
// phase's tok/s (and every run's). --profile 1 then runs one more prefill and decode with the table
// wrapped by the profiler (ops_profile.h) and prints, to stderr, the per-op table of the decode steps
// only (ms per decoded token), with the time outside any op; the JSON gets the decode breakdown.
//
//   bench_decode --model gpt2|CONFIG.json|HF_DIR [--prompt 128] [--tokens 64] [--threads 2] [--device cpu] [--seed 1]
//                [--precision fp32|bf16] [--repeats 3] [--profile 0|1]
#include "shardlm/cpu_features.h"
#include "shardlm/error.h"
#include "shardlm/kv_cache.h"
#include "shardlm/model.h"
#include "shardlm/model_source.h"
#include "shardlm/ops.h"
#include "shardlm/ops_profile.h"
#include "shardlm/precision.h"
#include "shardlm/rng.h"
#include "shardlm/sampler.h"

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

// The kernel's transparent huge page mode (the bracketed word of /sys/kernel/mm/transparent_hugepage/
// enabled: always, madvise or never; "unknown" where it cannot be read): with "never" the weights sit on
// 4 KiB pages and decode reads them markedly slower (ops_cpu.c's cpu_alloc asks for huge pages).
static void thp_mode(char *out, size_t cap) {
    snprintf(out, cap, "unknown");
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char line[128];
    if (!f) return;
    if (fgets(line, sizeof line, f)) {
        char *a = strchr(line, '['), *b = a ? strchr(a, ']') : NULL;
        if (a && b && b - a - 1 > 0 && (size_t)(b - a - 1) < cap) snprintf(out, cap, "%.*s", (int)(b - a - 1), a + 1);
    }
    fclose(f);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

// One prefill of ids (prompt tokens) from an empty cache, then `tokens` greedy decode steps; the
// seconds of each phase. -1 on an error (message in sl_error).
static int run_once(sl_model *m, sl_kv_cache *kv, const int *ids, int prompt, int tokens, double *t_prefill,
                    double *t_decode) {
    const float *logits = NULL;
    sl_kv_cache_reset(kv);
    double t0 = now_seconds();
    if (sl_model_forward_cached(m, kv, ids, prompt, &logits) || m->ops->synchronize()) return -1;
    double t1 = now_seconds();
    for (int i = 0; i < tokens; i++)
        if (sl_kv_cache_forward(kv, sl_argmax(logits, m->cfg.vocab_size), &logits)) return -1;
    if (m->ops->synchronize()) return -1;
    *t_prefill = t1 - t0;
    *t_decode = now_seconds() - t1;
    return 0;
}

// The decode steps' per-op breakdown as JSON fields ("decode_breakdown_ms": ms per token per op, and
// "decode_other_ms": the rest of a step's wall time) into buf.
static void breakdown_json(char *buf, size_t cap, double decode_s, int tokens) {
    int n;
    const sl_op_stat *st = sl_ops_profile_ops(&n);
    size_t len = (size_t)snprintf(buf, cap, ",\"decode_breakdown_ms\":{");
    for (int i = 0; i < n && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s\"%s\":%.4f", i ? "," : "", st[i].name,
                                1e3 * st[i].seconds / tokens);
    if (len < cap)
        snprintf(buf + len, cap - len, "},\"decode_other_ms\":%.4f",
                 1e3 * (decode_s - sl_ops_profile_total_seconds()) / tokens);
}

int main(int argc, char **argv) {
    const char *preset = "gpt2", *device = "cpu", *precision = "fp32";
    int prompt = 128, tokens = 64, threads = 0, profile = 0, repeats = 3;
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
        else if (!strcmp(f, "--precision")) precision = v;
        else if (!strcmp(f, "--repeats")) repeats = atoi(v);
        else {
            fprintf(stderr, "usage: %s [--model PRESET|CONFIG.json|HF_DIR] [--prompt P] [--tokens N] [--threads T] [--device D] [--seed S]\n"
                            "       [--precision fp32|bf16] [--repeats R] [--profile 0|1]\n", argv[0]);
            return 2;
        }
    }
    if ((argc - 1) % 2 || prompt < 1 || tokens < 1 || repeats < 1 || repeats > 100) {
        fprintf(stderr, "bench_decode: flags take one value each; --prompt and --tokens must be >= 1, --repeats 1..100\n");
        return 2;
    }
    if (strcmp(precision, "fp32") && strcmp(precision, "bf16")) {
        fprintf(stderr, "bench_decode: --precision must be fp32 or bf16 (got '%s')\n", precision);
        return 2;
    }
    if (threads > 0) sl_ops_cpu_set_threads(threads);
    sl_model_source src;
    const sl_ops *ops = sl_ops_for_device(device, 0);
    if (ops && !strcmp(precision, "bf16")) ops = sl_ops_for_precision(ops, SL_PRECISION_BF16);
    sl_model m;
    sl_kv_cache kv;
    if (!ops || sl_model_source_resolve(&src, preset) || sl_model_create(&m, &src.cfg, ops) || sl_model_init_weights(&m, seed) ||
        sl_model_params_changed(&m) || sl_kv_cache_init(&kv, &m, prompt + tokens)) {
        fprintf(stderr, "bench_decode: %s\n", sl_error());
        return 1;
    }
    int *ids = malloc(sizeof(int) * (size_t)prompt);
    sl_rng rng = sl_rng_make(seed, 0, 0, SL_RNG_DATA);
    for (int i = 0; i < prompt; i++) ids[i] = (int)sl_rng_below(&rng, (uint64_t)m.cfg.vocab_size);
    // one untimed run (first-use costs: GEMM library choice, oneDNN primitives, page faults), then timed
    double tp, td, prefill_tps[100], decode_tps[100];
    char runs[2048] = "", breakdown[4096] = "";
    size_t len = 0;
    int rc = run_once(&m, &kv, ids, prompt, tokens, &tp, &td);
    for (int r = 0; r < repeats && rc == 0; r++) {
        rc = run_once(&m, &kv, ids, prompt, tokens, &tp, &td);
        prefill_tps[r] = prompt / tp;
        decode_tps[r] = tokens / td;
        len += (size_t)snprintf(runs + len, sizeof runs - len, "%s[%.1f,%.2f]", r ? "," : "", prefill_tps[r],
                                decode_tps[r]);
    }
    if (rc == 0 && profile) {  // the decode steps of one more run, profiled
        m.ops = sl_ops_profile_wrap(ops);
        const float *logits = NULL;
        sl_kv_cache_reset(&kv);
        rc = sl_model_forward_cached(&m, &kv, ids, prompt, &logits);
        sl_ops_profile_reset();
        double t0 = now_seconds();
        for (int i = 0; i < tokens && rc == 0; i++) rc = sl_kv_cache_forward(&kv, sl_argmax(logits, m.cfg.vocab_size), &logits);
        double t = now_seconds() - t0;
        if (rc == 0) {
            fprintf(stderr, "decode steps (%d tokens at positions %d..%d), ms per token:\n", tokens, prompt,
                    prompt + tokens - 1);
            sl_ops_profile_report(stderr, tokens);
            fprintf(stderr, "  outside ops (logits copy, argmax, model code)      %8.3f\n",
                    1e3 * (t - sl_ops_profile_total_seconds()) / tokens);
            breakdown_json(breakdown, sizeof breakdown, t, tokens);
        }
        m.ops = ops;
    }
    if (rc) {
        fprintf(stderr, "bench_decode: %s\n", sl_error());
        return 1;
    }
    // bytes a decoded token reads: every parameter once (a tied head reads wte once more, counted once),
    // except the embedding tables it only takes one row of: wpe, and wte when the head is untied
    const sl_param_layout *L = &m.layout;
    double unread = (L->wpe >= 0 ? (double)L->tensors[L->wpe].numel : 0.0) +
                    (L->lm_head >= 0 && L->wte >= 0 ? (double)L->tensors[L->wte].numel : 0.0);
    double weight_bytes = ((double)L->total - unread) * (double)(ops->act_bf16 ? 2 : 4);
    double prefill = median(prefill_tps, repeats), decode = median(decode_tps, repeats);
    double bw = ops->on_device ? 0 : read_bandwidth((size_t)1 << 30);
    char isa[256], thp[32];
    sl_cpu_features_describe(isa, sizeof isa);
    thp_mode(thp, sizeof thp);
    printf("{\"impl\":\"shardlm-decode\",\"model\":\"%s\",\"device\":\"%s\",\"precision\":\"%s\",\"ops\":\"%s\","
           "\"threads\":%d,\"prompt\":%d,\"tokens\":%d,\"repeats\":%d,\"prefill_tok_s\":%.1f,\"decode_tok_s\":%.2f,"
           "\"runs\":[%s],\"weight_bytes\":%.0f,\"unread_params\":%.0f,\"decode_read_gb_s\":%.2f,\"machine_read_gb_s\":%.2f,"
           "\"cpu_isa\":\"%s\",\"thp\":\"%s\",\"gemm\":\"%s\"%s}\n",
           preset, device, precision, ops->name, omp_get_max_threads(), prompt, tokens, repeats, prefill, decode, runs,
           weight_bytes, unread, weight_bytes * decode / 1e9, bw, isa, thp, ops->on_device ? "device" : sl_cpu_gemm_description(),
           breakdown);
    free(ids);
    sl_kv_cache_free(&kv);
    sl_model_free(&m);
    return 0;
}
