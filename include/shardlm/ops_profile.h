// ops_profile.h: a profiling ops table. sl_ops_profile_wrap(inner) returns a table whose every op
// forwards to `inner` and adds the op's wall time and call count to a per-op-name total; matmuls
// are also totalled per shape (N, IC, OC), and matmul and attention count their floating-point
// operations so a report can show GFLOP/s. The model needs no change: hand it the wrapped table
// (sl_model_create(..., sl_ops_profile_wrap(&sl_ops_cpu)) or set model->ops).
//
// Invariants and limits: there is one profiler per process (the table's function pointers carry no
// context), so wrapping again replaces the inner table; ops must be called from one thread at a
// time (the model calls them from its own thread; ops parallelise inside). Ops that `inner` lacks
// stay NULL in the wrapped table. Time is CLOCK_MONOTONIC wall time around each call, about 50 ns
// of overhead per call.
#ifndef SHARDLM_OPS_PROFILE_H
#define SHARDLM_OPS_PROFILE_H

#include <stdio.h>
#include "shardlm/ops.h"

typedef struct {
    const char *name;  // op name as in sl_ops ("matmul_forward", ...), or a matmul shape
                       // ("matmul_forward N=1024 IC=768 OC=2304")
    double seconds;    // wall time summed over calls
    long calls;
    double flops;      // counted for matmul and attention only (0 otherwise); see ops_profile.c
} sl_op_stat;

// Points the profiler at `inner`, clears the totals and returns the wrapping table (static storage).
const sl_ops *sl_ops_profile_wrap(const sl_ops *inner);

// Clears the totals (keeps the inner table).
void sl_ops_profile_reset(void);

// Per-op totals, in the order the ops first ran; *n receives the count. Valid until the next reset/wrap.
const sl_op_stat *sl_ops_profile_ops(int *n);

// Per-matmul-shape totals (forward and backward separately), in first-run order.
const sl_op_stat *sl_ops_profile_matmul_shapes(int *n);

// Sum of the time of every op.
double sl_ops_profile_total_seconds(void);

// A human-readable table: ms per step (totals divided by `steps`), calls per step, share of op time,
// GFLOP/s where counted; then the matmul shapes.
void sl_ops_profile_report(FILE *f, int steps);

#endif
