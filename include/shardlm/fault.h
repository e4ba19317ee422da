// fault.h: deterministic fault injection for the fault-tolerance tests. With
//   SHARDLM_FAULT="RANK:STEP:WHERE"
// the process whose data-parallel rank is RANK kills itself with SIGKILL when it reaches optimizer
// step STEP at the point WHERE: "step" (between backward and the optimizer update) or "save"
// (inside the checkpoint write for that step, after its files are written, before it is committed).
// "overflow" does not kill: at that step the engine makes that rank's gradients non-finite, as an
// fp16 overflow would (the mixed-precision tests use it to check that exactly that step is skipped).
// Only the first attempt of a job faults (SHARDLM_RESTART_COUNT unset or 0), so a relaunch by
// `shardlm launch --max-restarts` runs clean. Without the variable this costs one getenv per call.
#ifndef SHARDLM_FAULT_H
#define SHARDLM_FAULT_H

#include <stdint.h>

void sl_fault_point(int rank, int64_t step, const char *where);
// 1 when SHARDLM_FAULT names this rank, step and point (first attempt only), without acting on it.
int sl_fault_fires(int rank, int64_t step, const char *where);

#endif
