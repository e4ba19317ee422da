// fault.c: SHARDLM_FAULT injection points (see fault.h).
#include "shardlm/fault.h"
#include "shardlm/settings.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sl_fault_fires(int rank, int64_t step, const char *where) {
    const sl_settings *s = sl_settings_get();
    const char *spec = s->fault;
    if (!spec[0] || s->restart_count != 0) return 0;
    int want_rank;
    long long want_step;
    char want_where[16];
    if (sscanf(spec, "%d:%lld:%15s", &want_rank, &want_step, want_where) != 3) return 0;
    return want_rank == rank && want_step == (long long)step && strcmp(want_where, where) == 0;
}

void sl_fault_point(int rank, int64_t step, const char *where) {
    if (!sl_fault_fires(rank, step, where)) return;
    fprintf(stderr, "fault injection: rank %d killing itself at step %lld (%s)\n", rank, (long long)step, where);
    fflush(stderr);
    raise(SIGKILL);
}
