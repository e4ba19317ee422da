// schedule.h: learning-rate schedules with DeepSpeed's names and parameter names (WarmupLR,
// WarmupDecayLR, WarmupCosineLR), parsed from DeepSpeed's "scheduler" block, plus a constant
// schedule (the optimizer's lr) when there is no block.
//
// Indexing, as DeepSpeed's engine does it (deepspeed/runtime/lr_schedules.py, verified against
// deepspeed 0.19.8): the scheduler is built with last_batch_iteration = -1, which already sets the
// optimizer's lr to get_lr() at iteration -1; after every applied optimizer step the engine calls
// scheduler.step(), which increments last_batch_iteration. So the optimizer step that follows
// `step` completed steps uses get_lr(last_batch_iteration = step - 1). In particular the first two
// steps both use warmup_min_lr (WarmupCosineLR: 0, then warmup_min_ratio * lr).
#ifndef SHARDLM_SCHEDULE_H
#define SHARDLM_SCHEDULE_H

#include <stdint.h>
#include <cjson/cJSON.h>

typedef enum {
    SL_SCHED_CONSTANT = 0,        // no "scheduler" block: the optimizer's lr every step
    SL_SCHED_WARMUP_LR = 1,       // WarmupLR
    SL_SCHED_WARMUP_DECAY_LR = 2, // WarmupDecayLR
    SL_SCHED_WARMUP_COSINE_LR = 3,// WarmupCosineLR
} sl_schedule_type;

typedef enum { SL_WARMUP_LOG = 0, SL_WARMUP_LINEAR = 1 } sl_warmup_type;

typedef struct {
    sl_schedule_type type;
    double optimizer_lr;      // the optimizer's params.lr (constant lr; WarmupCosineLR's base)
    double warmup_min_lr;     // WarmupLR / WarmupDecayLR (default 0)
    double warmup_max_lr;     // default: optimizer lr (WarmupLR), 0.001 (WarmupDecayLR), as DeepSpeed
    int64_t warmup_num_steps; // default 1000; must be >= 1; used as max(2, value), as DeepSpeed
    int64_t total_num_steps;  // WarmupDecayLR / WarmupCosineLR (required)
    double warmup_min_ratio;  // WarmupCosineLR (default 0)
    double cos_min_ratio;     // WarmupCosineLR (default 0.0001)
    sl_warmup_type warmup_type;  // default "log"
    char warning[256];        // after sl_schedule_parse: unknown keys, "" when none
} sl_schedule;

// Constant schedule at `optimizer_lr`.
void sl_schedule_constant(sl_schedule *s, double optimizer_lr);

// Parses {"type": "WarmupLR"|"WarmupDecayLR"|"WarmupCosineLR", "params": {...}}; NULL or JSON null
// gives the constant schedule. Errors name `where` and the key; unknown keys go to s->warning.
int sl_schedule_parse(sl_schedule *s, const cJSON *scheduler_block, double optimizer_lr, const char *where);

// The schedules `--lr-schedule` names, each warming up linearly over `warmup_steps` (>= 1; used as
// max(2, warmup_steps), as DeepSpeed does) to `lr`: SL_SCHED_WARMUP_COSINE_LR then falls along a cosine
// to 0.1 x lr at `total_steps`, SL_SCHED_WARMUP_DECAY_LR falls linearly to 0 at `total_steps`,
// SL_SCHED_WARMUP_LR stays at lr; SL_SCHED_CONSTANT is lr throughout. sl_schedule_warmup_linear fills s;
// sl_schedule_warmup_linear_block returns the DeepSpeed "scheduler" block that parses to the same
// schedule (what a config file would say; NULL for constant), for saving the resolved configuration.
void sl_schedule_warmup_linear(sl_schedule *s, sl_schedule_type type, double lr, int64_t warmup_steps,
                               int64_t total_steps);
cJSON *sl_schedule_warmup_linear_block(sl_schedule_type type, double lr, int64_t warmup_steps, int64_t total_steps);

// The learning rate for the optimizer step that follows `step` completed optimizer steps
// (step = 0 for the first step): DeepSpeed's get_lr() at last_batch_iteration = step - 1.
double sl_schedule_lr(const sl_schedule *s, int64_t step);

// DeepSpeed's get_lr() at a given last_batch_iteration (-1 before the first scheduler.step()).
double sl_schedule_lr_at_iteration(const sl_schedule *s, int64_t last_batch_iteration);

// "constant", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR".
const char *sl_schedule_name(sl_schedule_type type);

#endif
