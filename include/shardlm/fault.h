// fault.h: deterministic fault injection for the fault-tolerance tests. With
//   SHARDLM_FAULT="RANK:STEP:WHERE"
// the process whose data-parallel rank is RANK kills itself with SIGKILL when it reaches optimizer
// step STEP at the point WHERE: "step" (between backward and the optimizer update) or "save"
// (inside the checkpoint write for that step, after its files are written, before it is committed).
// Only the first attempt of a job faults (SHARDLM_RESTART_COUNT unset or 0), so a relaunch by
// `shardlm launch --max-restarts` runs clean. Without the variable this costs one getenv per call.
#ifndef SHARDLM_FAULT_H
#define SHARDLM_FAULT_H

#include <stdint.h>

void sl_fault_point(int rank, int64_t step, const char *where);

#endif
