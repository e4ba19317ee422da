// profile_ops.c: the profiling ops table of ops_profile.h. Each wrapper reads the monotonic clock,
// calls the inner op, and adds the elapsed time to its op's slot (and, for matmuls, to its shape's
// slot); on a device backend the clock is read after the queue drains (see tick). Slots are filled
// in first-call order, so a report lists ops in the order a step runs them. Memory functions and
// optimizer passes are the inner table's own, and so is set_precision (nothing to time).
//
// FLOP counts ("useful" work, as FLOP counters for training usually count it) are ops_list.h's flops
// column: GEMMs 2*N*IC*OC (twice for a backward computing dinp; a fused GELU is not counted),
// attention 4*HD per causal (query, key) pair per head forward and 8*HD backward.
#include "shardlm/ops_profile.h"

#include <stdint.h>
#include <string.h>
#include <time.h>

#define MAX_OPS 32
#define MAX_SHAPES 64
#define SHAPE_NAME_LEN 96

static const sl_ops *g_inner;
static sl_ops g_table;

static sl_op_stat g_ops[MAX_OPS];
static int g_n_ops;

typedef struct {
    int backward, N, IC, OC, parts, gelu;
} shape_key;
static sl_op_stat g_shapes[MAX_SHAPES];
static shape_key g_shape_keys[MAX_SHAPES];
static char g_shape_names[MAX_SHAPES][SHAPE_NAME_LEN];
static int g_n_shapes;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// The slot of op `name` (a string literal, compared by content), created on first use.
static sl_op_stat *op_slot(const char *name) {
    for (int i = 0; i < g_n_ops; i++)
        if (strcmp(g_ops[i].name, name) == 0) return &g_ops[i];
    if (g_n_ops == MAX_OPS) return NULL;
    sl_op_stat *s = &g_ops[g_n_ops++];
    memset(s, 0, sizeof *s);
    s->name = name;
    return s;
}

static void record(const char *name, double seconds, double flops) {
    sl_op_stat *s = op_slot(name);
    if (!s) return;
    s->seconds += seconds;
    s->calls++;
    s->flops += flops;
}

// parts: a backward's products, 1 dinp + 2 dweight.
static void record_shape(int backward, int N, int IC, int OC, int parts, int gelu, double seconds, double flops) {
    shape_key k = {backward, N, IC, OC, parts, gelu};
    int i = 0;
    for (; i < g_n_shapes; i++)
        if (memcmp(&g_shape_keys[i], &k, sizeof k) == 0) break;
    if (i == g_n_shapes) {
        if (g_n_shapes == MAX_SHAPES) return;
        g_n_shapes++;
        g_shape_keys[i] = k;
        // gelu: 0 a plain matmul, 1 matmul_gelu_*, 2 matmul_backward_gelu (the GELU gradient of its dinp)
        snprintf(g_shape_names[i], SHAPE_NAME_LEN, "%s%s N=%d IC=%d OC=%d%s", gelu == 1 ? "matmul_gelu" : "matmul",
                 backward ? (gelu == 2 ? "_backward_gelu" : "_backward") : "_forward", N, IC, OC,
                 !backward || parts == 3 ? "" : parts == 2 ? " (no dinp)" : parts == 1 ? " (no dweight)" : " (nothing)");
        memset(&g_shapes[i], 0, sizeof g_shapes[i]);
        g_shapes[i].name = g_shape_names[i];
    }
    g_shapes[i].seconds += seconds;
    g_shapes[i].calls++;
    g_shapes[i].flops += flops;
}

// The clock after the inner backend's queued work has finished: a device backend's ops return at
// once, so each wrapper waits for its op (this serialises the device's queue: profile separately
// from timed runs).
static double tick(void) {
    if (g_inner->on_device) g_inner->synchronize();
    return now_seconds();
}

// ---- wrappers: one per op of ops_list.h, same signature as the inner op ----------------------------

// What the list's flops column does after a call that took dt seconds.
#define SL_FLOPS(expr) record(op, dt, (expr));
#define SL_GEMM_FLOPS(backward, gelu, with_dinp, with_dweight)                                \
    {                                                                                         \
        double fl = 2.0 * N * (double)IC * OC * ((backward) ? (with_dinp) + (with_dweight) : 1); \
        record(op, dt, fl);                                                                   \
        record_shape(backward, N, IC, OC, (with_dinp) + 2 * (with_dweight), gelu, dt, fl);    \
    }
#define CALL_void(name, args) g_inner->name args;
#define CALL_double(name, args) double result = g_inner->name args;
#define RETURN_void
#define RETURN_double return result;
#define WRAP(ret, name, params, args, storage, flops, emulation) \
    static ret p_##name params {                                 \
        static const char op[] = #name;                          \
        double t0 = tick();                                      \
        CALL_##ret(name, args)                                   \
        double dt = tick() - t0;                                 \
        flops RETURN_##ret                                       \
    }
SL_OPS(WRAP)
#undef WRAP

// ---- public ---------------------------------------------------------------------------------------

void sl_ops_profile_reset(void) {
    g_n_ops = 0;
    g_n_shapes = 0;
}

#define WRAP(ret, name, params, args, storage, flops, emulation) g_table.name = inner->name ? p_##name : NULL;

const sl_ops *sl_ops_profile_wrap(const sl_ops *inner) {
    g_inner = inner;
    g_table = *inner;  // memory, optimizer passes and anything not wrapped go straight through
    g_table.name = "profile";
    SL_OPS(WRAP)
    sl_ops_profile_reset();
    return &g_table;
}

#undef WRAP

const sl_op_stat *sl_ops_profile_ops(int *n) {
    *n = g_n_ops;
    return g_ops;
}

const sl_op_stat *sl_ops_profile_matmul_shapes(int *n) {
    *n = g_n_shapes;
    return g_shapes;
}

double sl_ops_profile_total_seconds(void) {
    double s = 0;
    for (int i = 0; i < g_n_ops; i++) s += g_ops[i].seconds;
    return s;
}

static void report_rows(FILE *f, const sl_op_stat *rows, int n, int steps, double total) {
    for (int i = 0; i < n; i++) {
        const sl_op_stat *s = &rows[i];
        fprintf(f, "  %-52s %10.2f %8.1f %6.1f%%", s->name, 1e3 * s->seconds / steps, (double)s->calls / steps,
                total > 0 ? 100.0 * s->seconds / total : 0.0);
        if (s->flops > 0 && s->seconds > 0) fprintf(f, " %8.1f", s->flops / s->seconds / 1e9);
        fputc('\n', f);
    }
}

void sl_ops_profile_report(FILE *f, int steps) {
    if (steps < 1) steps = 1;
    double total = sl_ops_profile_total_seconds();
    fprintf(f, "  %-52s %10s %8s %7s %8s\n", "op", "ms/step", "calls", "share", "GFLOP/s");
    report_rows(f, g_ops, g_n_ops, steps, total);
    fprintf(f, "  %-52s %10.2f\n", "total in ops", 1e3 * total / steps);
    if (g_n_shapes > 0) {
        fprintf(f, "  matmul shapes:\n");
        report_rows(f, g_shapes, g_n_shapes, steps, total);
    }
}
