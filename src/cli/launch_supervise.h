// launch_supervise.h: what keeps a `shardlm launch` job's processes in hand (docs/launch.md,
// "Supervision").
//   * forwarded signals: the launcher's and each wrapper's handlers only record SIGINT, SIGTERM,
//     SIGHUP, SIGUSR1 and SIGUSR2; their loops take them and pass them on to the workers.
//   * sl_die_with_parent: every process the launcher starts (a fork wrapper, mpirun, srun) and every
//     program a wrapper starts is told by the kernel when its parent dies (PR_SET_PDEATHSIG).
//   * sl_hang_watch: a wrapper watches its program's heartbeat file (heartbeat.h) and calls the rank
//     hung when the file has not changed for the hang timeout, measured on the wrapper's own clock.
//   * the small process helpers the loops share (clock, sleep, exit codes, directories).
#ifndef SHARDLM_CLI_LAUNCH_SUPERVISE_H
#define SHARDLM_CLI_LAUNCH_SUPERVISE_H

#include <signal.h>
#include <stddef.h>
#include <sys/types.h>

#include "shardlm/heartbeat.h"

#define SL_HUNG_EXIT_CODE 124  // a rank killed for a missing heartbeat exits with this (as timeout(1))

// For a process just forked by parent_pid: `sig` is sent to it when that parent dies. Returns -1 when
// the parent has already died (the caller should not start anything).
int sl_die_with_parent(int sig, pid_t parent_pid);

typedef struct {
    char path[4200];     // DIR/.heartbeat_RANK
    int timeout_s;       // 0: no hang detection
    int watching;        // the program has written a heartbeat
    double last_change;  // monotonic time the record last changed
    double silent_s;     // at the last check: seconds since the record changed
    char record[SL_HEARTBEAT_RECORD + 1];
} sl_hang_watch;

// Sets up the watch of `rank`'s heartbeat file in dir (removing one left from an earlier attempt).
void sl_hang_watch_init(sl_hang_watch *w, const char *dir, int rank, int timeout_s);
// In the program's process before exec: exports SHARDLM_HEARTBEAT_FILE, SHARDLM_HEARTBEAT_INTERVAL_MS
// (a tenth of the timeout, within 0.1-5 s) and SHARDLM_HANG_TIMEOUT.
void sl_hang_watch_export(const sl_hang_watch *w);
// 1 when the program has beaten before and the record has not changed for timeout_s (w->silent_s:
// for how long), after printing "shardlm launch: rank R on host H: no heartbeat for ..." to stderr;
// 0 otherwise. `now` is CLOCK_MONOTONIC seconds.
int sl_hang_watch_tripped(sl_hang_watch *w, int rank, const char *host, double now);
// "step 12 training" from the last record ("no step reported" when there is none).
void sl_hang_watch_last_progress(const sl_hang_watch *w, char *buf, size_t cap);

// Forwarded signals (SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2): the handlers only record them;
// loops take them with launch_take_pending_signal and forward them.
void launch_install_forwarding(void);
void launch_reset_signals(void);             // defaults and an empty mask, in a child before exec
void launch_forwarded_sigset(sigset_t *set); // the forwarded signals as a set
void launch_clear_pending_signals(void);     // in a forked child: forget the parent's
int launch_take_pending_signal(void);        // the next pending signal (cleared), or 0
int launch_first_signal(void);               // the first signal received, or 0
double launch_now_s(void);                   // CLOCK_MONOTONIC seconds
void launch_sleep_ms(int ms);
int launch_exit_code_of(int wstatus);        // 128+signal for a signal
int launch_mkdir_p(const char *path);

#endif
