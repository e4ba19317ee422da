// bench_train.c: training throughput of one configuration. Builds a model from a preset, a config.json or
// a Hugging Face directory's config.json (sl_model_source_resolve) with random weights, an engine with
// AdamW (lr 1e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1, gradient clipping 1.0), and times full
// training steps (forward + backward + clip + AdamW + zero grads) on random token batches. Prints one
// JSON line (rank 0 only).
//
// Data parallelism: the world group comes from sl_comm_init_world("auto"), so under mpirun -np N the
// engine averages gradients over N MPI ranks (bucketed all-reduce, overlapping backward unless
// --overlap 0); --zero-stage 1|2|3 selects a ZeRO stage of src/train/zero.c (1 shards the optimizer
// state, 2 the gradients too, 3 the parameters too, gathered unit by unit with the next unit
// prefetched unless --prefetch 0). Every rank draws its own random batches (rank-dependent stream)
// of micro-batch B, so a step trains on B*T*N tokens: tokens_per_s is that global count / mean step
// time. A step's time is the slowest rank's.
// Communication: bytes_sent_per_step is what rank 0 handed to collectives on the group during the
// timed steps (sl_comm_bytes_sent: count x element size per call, i.e. 1 x the gradient bytes per
// all-reduce or reduce-scatter of all gradients, this rank's block per all-gather) / steps;
// bytes_sent_per_step_by_rank / _mean / _max give every rank's (ZeRO-3 ranks hand unequal amounts:
// each hands only its own part of a unit), and the mean is split by kind. Next to them: the ring
// all-reduce wire formula 2(N-1)/N x grad_bytes, ZeRO-3's 3(N-1)/N x grad_bytes, and a ring-model
// estimate of the wire bytes of what was handed. Memory: mem_{params,grads,optim}_bytes from
// sl_engine_memory_use on rank 0 (every rank allocates the same).
//
// Two passes, so that profiling cannot distort the headline:
//   1. --warmup W untimed steps, then --steps S timed steps with the plain ops table: the
//      headline ms_per_step (mean) and tokens_per_s = B*T / mean step time.
//   2. --profile-steps P steps with the profiling ops table (ops_profile.h): per-op ms per step, plus
//      "optimizer" (sl_engine_step: clip + AdamW + zero grad) and "model_other" (time of forward +
//      backward not spent inside an op: input checks, copies, memsets).
//
// Device and precision: --device cpu|cuda|cuda:N picks the ops table (sl_ops_for_device, as `shardlm
// train --device` does) and --precision fp32|bf16|fp16 the engine's mixed precision (fp32 master
// weights, DeepSpeed's bf16 / fp16 semantics). On a device every timed interval ends with
// ops->synchronize(), so the clock covers the queued work; peak_bytes is ops->peak_bytes() after
// reset_peak_bytes() at start (bytes held through ops->alloc: parameters, gradients, optimizer state,
// master weights, activations; the backend's private scratch such as cuBLASLt's workspace is not
// counted; 0 on the cpu). The profiled pass wraps the chosen table, which on a device synchronizes
// around every op (per-op device time, launch gaps included).
//
// --batch auto: the largest micro-batch that fits, trying --max-batch (64), then half, ... down to 1.
// Each try runs in a child process (fork, before this process touches the device): it builds the
// model and engine and runs one full step; an allocation failure is an error returned by ops->alloc
// (or a recorded CUDA error at the step's synchronize), never a crash, and a failed try leaves no
// poisoned device context behind. The tries are reported as "batch_search".
//
//   bench_train --model gpt2 --batch 4 --seq 256 --threads 2 --steps 3 --warmup 1 [--profile-steps 1]
//               [--seed 1234] [--report]   (--report also prints the profile table to stderr)
//               [--device cpu|cuda|cuda:N] [--precision fp32|bf16|fp16] [--batch auto [--max-batch 64]]
//               [--overlap 0|1] [--zero-stage 0|1|2|3] [--prefetch 0|1] [--bucket ELEMENTS]
//               [--first-bucket ELEMENTS] [--lora-r R]
//   --lora-r R: the step of LoRA fine-tuning instead (adapters of rank R, alpha 2R, on every linear of the
//   blocks; base frozen; the profile then shows the adapters' lora_forward / lora_backward ops)
//   mpirun -np 2 -x OMP_NUM_THREADS=1 bench_train --model gpt2 --batch 4 --seq 256 --threads 1 ...
#include "shardlm/cpu_features.h"
#include "shardlm/comm.h"
#include "shardlm/config.h"
#include "shardlm/engine.h"
#include "shardlm/error.h"
#include "shardlm/launch_env.h"
#include "shardlm/lora.h"
#include "shardlm/model.h"
#include "shardlm/model_source.h"
#include "shardlm/ops.h"
#include "shardlm/ops_profile.h"
#include "shardlm/rng.h"
#include "shardlm/settings.h"
#include "shardlm/attention_choice.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    const char *model;
    const char *device;               // cpu | cuda | cuda:N
    int precision;                    // sl_precision
    int B, T, threads, steps, warmup, profile_steps, report;
    int batch_auto, max_batch;        // --batch auto: search from max_batch down
    int overlap, zero_stage, prefetch;
    long long bucket, first_bucket;   // elements
    unsigned long long seed;
    int rank, world;                  // of the data-parallel group
    int lora_r;                       // --lora-r R: LoRA adapters (alpha 2R, every linear), base frozen
} bench_args;

static sl_lora g_lora;  // the adapters of a --lora-r run (attached to the model)

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// CPU seconds the whole machine spent busy (user, nice, system, irq, softirq, steal) since boot,
// from /proc/stat; -1 when unreadable.
static double machine_busy_seconds(void) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return -1;
    unsigned long long v[8] = {0};
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
                   &v[7]);
    fclose(f);
    if (n < 8) return -1;
    long hz = sysconf(_SC_CLK_TCK);
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / (double)(hz > 0 ? hz : 100);
}

// CPU seconds this process (all its threads) has used.
static double own_cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
           1e-6 * (double)ru.ru_stime.tv_usec;
}

static int usage(const char *prog) {
    fprintf(stderr,
            "usage: %s --model PRESET --batch B --seq T [--threads N] [--steps S] [--warmup W]\n"
            "          [--profile-steps P] [--seed SEED] [--report] [--overlap 0|1] [--zero-stage 0|1|2|3]\n"
            "          [--prefetch 0|1] [--bucket ELEMENTS] [--first-bucket ELEMENTS]\n"
            "          [--device cpu|cuda|cuda:N] [--precision fp32|bf16|fp16] [--max-batch M] [--lora-r R]\n"
            "          (--batch auto: the largest micro-batch of M, M/2, ..., 1 that runs a step)\n",
            prog);
    return 2;
}

static int parse_int(const char *s, int *out, const char *flag) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < 0 || v > 1000000) {
        fprintf(stderr, "bench_train: %s expects a non-negative integer, got '%s'\n", flag, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_ll(const char *s, long long *out, const char *flag) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < 1) {
        fprintf(stderr, "bench_train: %s expects a positive integer, got '%s'\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_precision(const char *s, int *out) {
    if (strcmp(s, "fp32") == 0) *out = SL_PRECISION_FP32;
    else if (strcmp(s, "bf16") == 0) *out = SL_PRECISION_BF16;
    else if (strcmp(s, "fp16") == 0) *out = SL_PRECISION_FP16;
    else {
        fprintf(stderr, "bench_train: --precision expects fp32, bf16 or fp16, got '%s'\n", s);
        return -1;
    }
    return 0;
}

static int parse_args(int argc, char **argv, bench_args *a) {
    *a = (bench_args){.model = "gpt2-demo", .device = "cpu", .precision = SL_PRECISION_FP32, .B = 8, .T = 128,
                      .max_batch = 64, .threads = 1, .steps = 10, .warmup = 2,
                      .profile_steps = -1, .seed = 1234, .overlap = 1, .zero_stage = 0, .prefetch = 1,
                      .bucket = 6553600,  // train's reduce_bucket_size default (25 MiB of fp32)
                      .first_bucket = 262144, .world = 1};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (strcmp(f, "--report") == 0) { a->report = 1; continue; }
        if (i + 1 >= argc) return usage(argv[0]);
        const char *v = argv[++i];
        int rc = 0;
        if (strcmp(f, "--model") == 0) a->model = v;
        else if (strcmp(f, "--batch") == 0) {
            a->batch_auto = strcmp(v, "auto") == 0;
            if (!a->batch_auto) rc = parse_int(v, &a->B, f);
        }
        else if (strcmp(f, "--max-batch") == 0) rc = parse_int(v, &a->max_batch, f);
        else if (strcmp(f, "--device") == 0) a->device = v;
        else if (strcmp(f, "--precision") == 0) rc = parse_precision(v, &a->precision);
        else if (strcmp(f, "--seq") == 0) rc = parse_int(v, &a->T, f);
        else if (strcmp(f, "--threads") == 0) rc = parse_int(v, &a->threads, f);
        else if (strcmp(f, "--steps") == 0) rc = parse_int(v, &a->steps, f);
        else if (strcmp(f, "--warmup") == 0) rc = parse_int(v, &a->warmup, f);
        else if (strcmp(f, "--profile-steps") == 0) rc = parse_int(v, &a->profile_steps, f);
        else if (strcmp(f, "--seed") == 0) a->seed = strtoull(v, NULL, 10);
        else if (strcmp(f, "--overlap") == 0) rc = parse_int(v, &a->overlap, f);
        else if (strcmp(f, "--zero-stage") == 0) rc = parse_int(v, &a->zero_stage, f);
        else if (strcmp(f, "--prefetch") == 0) rc = parse_int(v, &a->prefetch, f);
        else if (strcmp(f, "--bucket") == 0) rc = parse_ll(v, &a->bucket, f);
        else if (strcmp(f, "--first-bucket") == 0) rc = parse_ll(v, &a->first_bucket, f);
        else if (strcmp(f, "--lora-r") == 0) rc = parse_int(v, &a->lora_r, f);
        else return usage(argv[0]);
        if (rc) return 2;
    }
    if ((!a->batch_auto && a->B < 1) || a->T < 1 || a->steps < 1 || a->max_batch < 1) {
        fprintf(stderr, "bench_train: --batch, --seq, --steps and --max-batch must be at least 1\n");
        return 2;
    }
    if (a->overlap > 1 || a->prefetch > 1 || a->zero_stage > 3) {
        fprintf(stderr, "bench_train: --overlap and --prefetch take 0 or 1, --zero-stage 0, 1, 2 or 3\n");
        return 2;
    }
    if (a->profile_steps < 0) a->profile_steps = a->steps;
    return 0;
}

// Random tokens in [0, vocab) for step `step`: inputs are positions 0..T-1, targets 1..T of one
// (B, T+1) draw, as a data loader would cut them. Each data-parallel rank draws its own stream.
static void fill_batch(int *inputs, int *targets, int B, int T, int vocab, unsigned long long seed, int rank,
                       int step) {
    sl_rng rng = sl_rng_make(seed, (uint64_t)rank, (uint64_t)step, SL_RNG_DATA);
    for (int b = 0; b < B; b++) {
        int prev = (int)sl_rng_below(&rng, (uint64_t)vocab);
        for (int t = 0; t < T; t++) {
            int next = (int)sl_rng_below(&rng, (uint64_t)vocab);
            inputs[b * T + t] = prev;
            targets[b * T + t] = next;
            prev = next;
        }
    }
}

typedef struct {
    double fb_seconds, step_seconds;  // summed over the steps run
    float last_loss;
} run_totals;

// Waits for the device's queued work (nothing to wait for on the cpu), so the clock read after it
// covers that work; -1 with the error when queued work failed.
static int drain(const sl_engine *e) {
    const sl_ops *ops = e->model->ops;
    return ops->on_device ? ops->synchronize() : 0;
}

// Runs `n` training steps numbered from `first`; adds their times to *tot.
static int run_steps(sl_engine *e, int *inputs, int *targets, const bench_args *a, int first, int n,
                     double *per_step, run_totals *tot) {
    int vocab = e->model->cfg.vocab_size;
    for (int s = 0; s < n; s++) {
        fill_batch(inputs, targets, a->B, a->T, vocab, a->seed, a->rank, first + s);
        float loss;
        double t0 = now_seconds();
        if (sl_engine_forward_backward(e, inputs, targets, a->B, a->T, &loss) || drain(e)) return -1;
        double t1 = now_seconds();
        if (sl_engine_step(e) || drain(e)) return -1;
        double t2 = now_seconds();
        if (per_step) per_step[s] = t2 - t0;
        if (tot) {
            tot->fb_seconds += t1 - t0;
            tot->step_seconds += t2 - t1;
            tot->last_loss = loss;
        }
    }
    return 0;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

// An error on any rank: print it with the rank and exit without finalising MPI, so that mpirun
// stops the whole job instead of leaving the other ranks waiting in a collective.
static int die(const bench_args *a) {
    if (a->world > 1) fprintf(stderr, "bench_train: [rank %d] %s\n", a->rank, sl_error());
    else fprintf(stderr, "bench_train: %s\n", sl_error());
    fflush(stderr);
    return 1;
}

// The ops table of --device, a model of the preset with random weights, and an engine with the
// benchmark's optimizer, on data-parallel group `dp`. The device's peak-memory mark starts here.
static int build(const bench_args *a, sl_comm *dp, const sl_ops **ops_out, sl_model *model, sl_engine *engine) {
    sl_ops_cpu_set_threads(a->threads);
    sl_launch_env env;
    int local_rank = sl_launch_env_detect(&env) == 0 ? env.local_rank : 0;
    const sl_ops *ops = sl_ops_for_device(a->device, local_rank);
    if (!ops) return -1;
    ops = sl_ops_for_precision(ops, a->precision);  // as `shardlm train` picks it
    if (ops->reset_peak_bytes) ops->reset_peak_bytes();
    *ops_out = ops;
    sl_model_source src;  // a preset, a config.json or a Hugging Face directory: its shape, random weights
    if (sl_model_source_resolve(&src, a->model)) return -1;
    sl_model_config cfg = src.cfg;
    if (a->T > cfg.max_seq_len) return sl_errorf("--seq %d exceeds %s's %d positions", a->T, a->model, cfg.max_seq_len);
    if (sl_model_create(model, &cfg, ops)) return -1;
    if (sl_model_init_weights(model, a->seed)) return -1;
    if (a->lora_r) {  // LoRA on every linear of the blocks: the engine then trains the adapters alone
        sl_lora_config lc;
        sl_lora_config_defaults(&lc);
        lc.r = a->lora_r;
        lc.lora_alpha = 2.0 * a->lora_r;
        if (sl_lora_config_set_targets(&lc, "all-linear", "--lora-r") || sl_lora_create(&g_lora, &cfg, &lc, ops) ||
            sl_lora_init_weights(&g_lora, a->seed + 1) || sl_model_attach_lora(model, &g_lora))
            return -1;
    }

    sl_engine_config ec;
    memset(&ec, 0, sizeof ec);
    ec.micro_batch = a->B;
    ec.grad_accum_steps = 1;
    ec.gradient_clipping = 1.0f;
    sl_optim_defaults(&ec.optim);
    ec.optim.type = SL_OPTIM_ADAMW;
    ec.optim.lr = 1e-4;
    ec.optim.beta1 = 0.9;
    ec.optim.beta2 = 0.95;
    ec.optim.eps = 1e-8;
    ec.optim.weight_decay = 0.1;
    sl_schedule_constant(&ec.schedule, ec.optim.lr);
    ec.dp = dp;
    ec.reduce_bucket_size = (size_t)a->bucket;
    ec.first_bucket_size = (size_t)a->first_bucket;
    ec.overlap_comm = a->overlap;
    ec.zero_stage = a->zero_stage;
    ec.prefetch = a->prefetch;
    sl_loss_scaler_defaults(&ec.precision);   // DeepSpeed's defaults, as `shardlm train` starts from
    ec.precision.precision = (sl_precision)a->precision;
    return sl_engine_init(engine, model, &ec);
}

// One try of the batch search, in a child process: build everything at a->B and run one step.
static int try_batch(const bench_args *a) {
    sl_comm *self = NULL;
    const sl_ops *ops;
    sl_model model;
    sl_engine engine;
    if (sl_comm_init_world(&self, "self", NULL, NULL) || build(a, self, &ops, &model, &engine)) return -1;
    size_t N = (size_t)a->B * a->T;
    int *inputs = malloc(N * sizeof(int)), *targets = malloc(N * sizeof(int));
    if (!inputs || !targets) return sl_errorf("out of host memory for a batch of %zu tokens", N);
    return run_steps(&engine, inputs, targets, a, 0, 1, NULL, NULL);
}

#define MAX_TRIES 24
static int tried_B[MAX_TRIES], tried_ok[MAX_TRIES], n_tried;

// Whether an error message says memory ran out (ops->alloc's "out of GPU memory allocating ...", a
// recorded CUDA "out of memory", cuBLAS's ALLOC_FAILED, the host's "out of memory").
static int is_out_of_memory(const char *msg) {
    return strstr(msg, "out of GPU memory") || strstr(msg, "out of memory") || strstr(msg, "ALLOC_FAILED") ||
           strstr(msg, "out of host memory");
}

enum { TRY_FITS = 0, TRY_NO_MEMORY = 3, TRY_FAILED = 4 };

// --batch auto: B = max_batch, max_batch/2, ..., 1, each tried in a forked child (so this process
// never touches the device before the real run); a->B becomes the first that ran a step. A try that
// fails for any reason but memory (no GPU, a kernel error) ends the search: smaller batches would
// fail the same way.
static int search_batch(bench_args *a) {
    for (int B = a->max_batch; B >= 1 && n_tried < MAX_TRIES; B /= 2) {
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid < 0) return sl_errorf("batch search: fork failed");
        if (pid == 0) {
            a->B = B;
            if (try_batch(a) == 0) _exit(TRY_FITS);
            int oom = is_out_of_memory(sl_error());
            fprintf(stderr, "bench_train: batch search: B=%d %s: %s\n", B, oom ? "does not fit" : "failed", sl_error());
            _exit(oom ? TRY_NO_MEMORY : TRY_FAILED);
        }
        int status = 0;
        if (waitpid(pid, &status, 0) < 0) return sl_errorf("batch search: waitpid failed");
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1, ok = code == TRY_FITS;
        tried_B[n_tried] = B;
        tried_ok[n_tried++] = ok;
        if (WIFSIGNALED(status))
            return sl_errorf("batch search: the try at B=%d died of signal %d", B, WTERMSIG(status));
        if (!ok && code != TRY_NO_MEMORY) return sl_errorf("batch search: the try at B=%d failed (not for memory)", B);
        if (ok) {
            fprintf(stderr, "bench_train: batch search: B=%d fits (%s, %s, T=%d)\n", B, a->model, a->device, a->T);
            a->B = B;
            return 0;
        }
    }
    return sl_errorf("batch search: no micro-batch from %d down to 1 ran a step of %s at T=%d on %s", a->max_batch,
                     a->model, a->T, a->device);
}

int main(int argc, char **argv) {
    bench_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc;
    if (a.batch_auto) {
        sl_launch_env env;
        if (sl_launch_env_detect(&env) == 0 && env.world_size > 1) {
            fprintf(stderr, "bench_train: --batch auto runs in a single process only (not under a launcher)\n");
            return 2;
        }
        if (search_batch(&a)) return die(&a);
    }
    sl_comm *world = NULL;
    if (sl_comm_init_world(&world, "auto", NULL, NULL)) { fprintf(stderr, "bench_train: %s\n", sl_error()); return 1; }
    a.rank = sl_comm_rank(world);
    a.world = sl_comm_size(world);
    int rank0 = a.rank == 0;

    const sl_ops *ops;
    sl_model model;
    sl_engine engine;
    if (build(&a, world, &ops, &model, &engine)) return die(&a);
    sl_model_config cfg = model.cfg;

    size_t N = (size_t)a.B * a.T;                      // tokens per rank per step
    double global_tokens = (double)N * a.world;        // tokens per step over all ranks
    int *inputs = malloc(N * sizeof(int)), *targets = malloc(N * sizeof(int));
    double *per_step = malloc(sizeof(double) * (size_t)a.steps);
    if (!inputs || !targets || !per_step) { fprintf(stderr, "bench_train: out of memory\n"); return 1; }

    // pass 1: headline, plain ops
    int step_no = 0;
    if (run_steps(&engine, inputs, targets, &a, step_no, a.warmup, NULL, NULL)) return die(&a);
    step_no += a.warmup;
    run_totals head = {0};
    if (a.world > 1 && sl_comm_barrier(world)) return die(&a);   // every rank starts the clock together
    size_t bytes0 = sl_comm_bytes_sent(world);
    double busy0 = machine_busy_seconds(), own0 = own_cpu_seconds(), wall0 = now_seconds();
    if (run_steps(&engine, inputs, targets, &a, step_no, a.steps, per_step, &head)) return die(&a);
    step_no += a.steps;
    double wall = now_seconds() - wall0, busy1 = machine_busy_seconds(), own = own_cpu_seconds() - own0;
    size_t bytes1 = sl_comm_bytes_sent(world);
    size_t peak_bytes = ops->peak_bytes ? ops->peak_bytes() : 0;   // start, warmup and timed steps
    // a step takes as long as its slowest rank; CPU time of every rank is the benchmark's own
    if (a.world > 1 && (sl_comm_allreduce(world, per_step, (size_t)a.steps, SL_DTYPE_F64, SL_OP_MAX) ||
                        sl_comm_allreduce(world, &own, 1, SL_DTYPE_F64, SL_OP_SUM)))
        return die(&a);
    // cores' worth of CPU that other processes (or the hypervisor: steal) used during the timed steps
    double other_load = busy0 >= 0 && busy1 >= 0 && wall > 0 ? (busy1 - busy0 - own) / wall : -1;
    if (other_load < 0 && busy0 >= 0) other_load = 0;
    double sum = 0;
    for (int s = 0; s < a.steps; s++) sum += per_step[s];
    double mean = sum / a.steps;
    qsort(per_step, (size_t)a.steps, sizeof(double), cmp_double);
    double min = per_step[0], median = per_step[a.steps / 2];
    if (a.steps % 2 == 0) median = 0.5 * (per_step[a.steps / 2 - 1] + per_step[a.steps / 2]);

    // communication volume per step: what this rank handed to collectives, split by kind, and the ring
    // model of the bytes it puts on the wire: all-reduce 2(N-1)/N x its buffer, reduce-scatter
    // (N-1)/N x its input, all-gather (N-1) x its block. The split is by what the engine calls (one
    // micro-batch per step): DDP all-reduces the gradients (1 x grad bytes) and the loss (8 bytes);
    // ZeRO reduce-scatters all gradients once (1 x grad bytes, per unit), all-reduces the squared
    // norm and the loss (8 bytes each), and the rest is all-gathers (stages 1-2: the updated
    // parameters, this rank's block; stage 3: each unit's parameters when the model needs them, in
    // forward and again in backward unless the unit's window still holds it).
    // Ranks hand different amounts when a unit's parameters are not spread evenly over them (ZeRO-3
    // gathers: a rank hands only its own part of each unit), so the split and the wire estimate use
    // the mean over ranks; bytes_sent_per_step stays rank 0's own count.
    double W = a.world;
    double bytes_per_step = (double)(bytes1 - bytes0) / a.steps;
    double *rank_bytes = malloc(sizeof(double) * (size_t)a.world);
    if (!rank_bytes) { fprintf(stderr, "bench_train: out of memory\n"); return 1; }
    rank_bytes[0] = bytes_per_step;
    if (a.world > 1 && sl_comm_allgather(world, &bytes_per_step, rank_bytes, 1, SL_DTYPE_F64)) return die(&a);
    double bytes_mean = 0, bytes_max = 0;
    for (int r = 0; r < a.world; r++) {
        bytes_mean += rank_bytes[r] / W;
        if (rank_bytes[r] > bytes_max) bytes_max = rank_bytes[r];
    }
    double grad_bytes = 4.0 * (double)model.layout.total;
    double ring_formula = 2.0 * (W - 1) / W * grad_bytes;
    double stage3_formula = 3.0 * (W - 1) / W * grad_bytes;
    double allreduce_bytes = 0, reduce_scatter_bytes = 0, allgather_bytes = 0;
    if (engine.sharded) {
        reduce_scatter_bytes = grad_bytes;
        allreduce_bytes = a.world > 1 ? 16.0 : 0.0;
        allgather_bytes = bytes_mean - reduce_scatter_bytes - allreduce_bytes;
        if (allgather_bytes < 0) allgather_bytes = 0;
    } else {
        allreduce_bytes = bytes_mean;
    }
    double wire_estimate = 2.0 * (W - 1) / W * allreduce_bytes + (W - 1) / W * reduce_scatter_bytes +
                           (W - 1) * allgather_bytes;

    // pass 2: breakdown, profiling ops (every rank takes part: the steps communicate)
    run_totals prof = {0};
    if (a.profile_steps > 0) {
        model.ops = g_lora.ops = sl_ops_profile_wrap(ops);  // the adapters' ops are the model's
        if (run_steps(&engine, inputs, targets, &a, step_no, a.profile_steps, NULL, &prof)) return die(&a);
        model.ops = ops;
        if (model.lora) g_lora.ops = ops;
    }
    sl_engine_memory mem = sl_engine_memory_use(&engine);

    if (!rank0) goto done;
    printf("{\"impl\":\"shardlm\",\"model\":\"%s\",\"B\":%d,\"T\":%d,\"threads\":%d,\"steps\":%d,\"warmup\":%d,"
           "\"ms_per_step\":%.3f,\"ms_per_step_min\":%.3f,\"ms_per_step_median\":%.3f,\"tokens_per_s\":%.2f,"
           "\"ms_forward_backward\":%.3f,\"ms_optimizer\":%.3f,\"loss\":%.5f,\"params\":%zu,\"lora_r\":%d,"
           "\"openblas\":\"%s\",\"openblas_core\":\"%s\",\"other_load\":%.2f,\"own_cpu_util\":%.2f",
           a.model, a.B, a.T, a.threads, a.steps, a.warmup, 1e3 * mean, 1e3 * min, 1e3 * median, global_tokens / mean,
           1e3 * head.fb_seconds / a.steps, 1e3 * head.step_seconds / a.steps, head.last_loss, model.layout.total,
           a.lora_r,
           openblas_get_config(), openblas_get_corename(), other_load, wall > 0 ? own / wall : 0.0);
    char isa[256];
    sl_cpu_features_describe(isa, sizeof isa);
    printf(",\"cpu_isa\":\"%s\",\"gemm\":\"%s\",\"attention\":\"%s\",\"attention_grid\":\"%s\","
           "\"attention_dq\":\"%s\",\"cudnn_version\":%zu", isa, ops->on_device ? "device" : sl_cpu_gemm_description(),
           sl_attention_ran() ? sl_attention_ran_name() : sl_attention_name(sl_settings_get()->attention),
           sl_attention_grid_name(sl_settings_get()->attention_grid),
           sl_attention_dq_name(sl_settings_get()->attention_dq), sl_attention_cudnn_version());
    printf(",\"device\":\"%s\",\"ops\":\"%s\",\"precision\":\"%s\",\"peak_bytes\":%zu,\"n_layer\":%d,"
           "\"n_head\":%d,\"n_embd\":%d,\"vocab_size\":%d,\"padded_vocab_size\":%d,\"batch_search\":[",
           a.device, ops->name, sl_precision_name((sl_precision)a.precision), peak_bytes, cfg.n_layer, cfg.n_head,
           cfg.n_embd, cfg.vocab_size, cfg.padded_vocab_size);
    for (int i = 0; i < n_tried; i++) printf("%s{\"B\":%d,\"fits\":%d}", i ? "," : "", tried_B[i], tried_ok[i]);
    printf("]");
    printf(",\"world\":%d,\"backend\":\"%s\",\"global_batch\":%d,\"zero_stage\":%d,\"overlap\":%d,\"bucket\":%lld,"
           "\"first_bucket\":%lld,\"buckets\":%d,\"bytes_sent_per_step\":%.0f,\"grad_bytes\":%.0f,"
           "\"ring_allreduce_bytes_formula\":%.0f,\"stage3_bytes_formula\":%.0f,\"sent_over_grad_bytes\":%.4f,"
           "\"ring_wire_bytes_estimate\":%.0f,\"optim_state_bytes\":%zu",
           a.world, sl_comm_backend_of(world) == SL_COMM_MPI ? "mpi" : "self", a.B * a.world, a.zero_stage,
           a.overlap, a.bucket, a.first_bucket, engine.distributed && !engine.sharded ? engine.ddp.n_buckets : 0,
           bytes_per_step, grad_bytes, ring_formula, stage3_formula, bytes_per_step / grad_bytes, wire_estimate,
           mem.optim);
    printf(",\"bytes_sent_per_step_mean\":%.0f,\"bytes_sent_per_step_max\":%.0f,\"mean_sent_over_grad_bytes\":%.4f,"
           "\"bytes_sent_per_step_by_rank\":[",
           bytes_mean, bytes_max, bytes_mean / grad_bytes);
    for (int r = 0; r < a.world; r++) printf("%s%.0f", r ? "," : "", rank_bytes[r]);
    printf("]");
    printf(",\"prefetch\":%d,\"allreduce_bytes_per_step\":%.0f,\"reduce_scatter_bytes_per_step\":%.0f,"
           "\"allgather_bytes_per_step\":%.0f,\"mem_params_bytes\":%zu,\"mem_grads_bytes\":%zu,"
           "\"mem_optim_bytes\":%zu,\"mem_total_bytes\":%zu",
           a.zero_stage == 3 ? a.prefetch : 0, allreduce_bytes, reduce_scatter_bytes, allgather_bytes, mem.params,
           mem.grads, mem.optim, mem.params + mem.grads + mem.optim);
    if (a.profile_steps > 0) {
        int P = a.profile_steps, n_ops, n_shapes;
        const sl_op_stat *stat = sl_ops_profile_ops(&n_ops);
        const sl_op_stat *shapes = sl_ops_profile_matmul_shapes(&n_shapes);
        double op_total = sl_ops_profile_total_seconds(), gemm = 0;
        double step_total = prof.fb_seconds + prof.step_seconds;
        printf(",\"profile_steps\":%d,\"profiled_ms_per_step\":%.3f,\"breakdown\":{", P, 1e3 * step_total / P);
        for (int i = 0; i < n_ops; i++) {
            printf("%s\"%s\":%.3f", i ? "," : "", stat[i].name, 1e3 * stat[i].seconds / P);
            if (strncmp(stat[i].name, "matmul_", 7) == 0) gemm += stat[i].seconds;
        }
        printf("%s\"optimizer\":%.3f,\"model_other\":%.3f}", n_ops ? "," : "", 1e3 * prof.step_seconds / P,
               1e3 * (prof.fb_seconds - op_total) / P);
        printf(",\"gflops\":{");
        int first = 1;
        for (int i = 0; i < n_ops; i++) {
            if (stat[i].flops <= 0 || stat[i].seconds <= 0) continue;
            printf("%s\"%s\":%.2f", first ? "" : ",", stat[i].name, stat[i].flops / stat[i].seconds / 1e9);
            first = 0;
        }
        printf("},\"matmul_shapes\":[");
        for (int i = 0; i < n_shapes; i++)
            printf("%s{\"shape\":\"%s\",\"ms\":%.3f,\"calls\":%.2f,\"gflops\":%.2f}", i ? "," : "", shapes[i].name,
                   1e3 * shapes[i].seconds / P, (double)shapes[i].calls / P,
                   shapes[i].seconds > 0 ? shapes[i].flops / shapes[i].seconds / 1e9 : 0.0);
        printf("],\"gemm_fraction\":%.4f", step_total > 0 ? gemm / step_total : 0.0);
        if (a.report) {
            fprintf(stderr, "profile of %s B=%d T=%d threads=%d ranks=%d device=%s precision=%s (rank 0) over %d "
                    "steps:\n", a.model, a.B, a.T, a.threads, a.world, a.device,
                    sl_precision_name((sl_precision)a.precision), P);
            sl_ops_profile_report(stderr, P);
        }
    }
    printf("}\n");
    fflush(stdout);
done:
    free(inputs);
    free(targets);
    free(per_step);
    free(rank_bytes);
    sl_engine_free(&engine);
    sl_model_free(&model);
    sl_lora_free(&g_lora);
    sl_comm_free(world);
    return 0;
}
