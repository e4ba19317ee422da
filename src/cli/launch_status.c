// launch_status.c: each rank's status file, STATUS_DIR/.status_RANK, one line written by the rank's
// wrapper when its program ends (rank, exit code, signal, whether the launcher stopped it, time,
// host, hang details), and the launcher's reading of them: which rank failed first, on its own, and
// the message that names it (with its host, signal or missing heartbeat, and log file).
#include "cli/launch.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// One line: rank code signal stopped time host hung silent-seconds last-progress...
void launch_write_status(const char *status_dir, int rank, const char *host, int code, int sig, int stopped, const sl_hang_watch *hang) {
    if (!status_dir) return;
    char path[DERIVED_PATH_MAX], tmp[DERIVED_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/.status_%d", status_dir, rank);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        launch_mkdir_p(status_dir);
        f = fopen(tmp, "w");
        if (!f) return;  // e.g. a remote node without the launcher's directory: the launcher falls back
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char progress[SL_HEARTBEAT_RECORD + 1] = "-";
    if (hang) sl_hang_watch_last_progress(hang, progress, sizeof progress);
    fprintf(f, "%d %d %d %d %lld.%09ld %s %d %.1f %s\n", rank, code, sig, stopped, (long long)ts.tv_sec, ts.tv_nsec, host,
            hang != NULL, hang ? hang->silent_s : 0.0, progress);
    fclose(f);
    rename(tmp, path);
}

static int launch_read_status(const char *dir, int rank, worker_status *s) {
    char path[DERIVED_PATH_MAX];
    snprintf(path, sizeof path, "%s/.status_%d", dir, rank);
    FILE *f = fopen(path, "r");
    memset(s, 0, sizeof *s);
    if (!f) return -1;
    int ok = fscanf(f, "%d %d %d %d %lf %255s %d %lf ", &s->rank, &s->code, &s->sig, &s->stopped, &s->time, s->host, &s->hung,
                    &s->silent_s) == 8;
    if (ok && fgets(s->progress, sizeof s->progress, f)) s->progress[strcspn(s->progress, "\n")] = '\0';
    fclose(f);
    s->found = ok;
    return ok ? 0 : -1;
}

void launch_clear_status(const char *dir, int world) {
    char path[DERIVED_PATH_MAX];
    for (int r = 0; r < world; r++) {
        snprintf(path, sizeof path, "%s/.status_%d", dir, r);
        unlink(path);
        snprintf(path, sizeof path, "%s/.heartbeat_%d", dir, r);
        unlink(path);
    }
}

int launch_first_failure(const launch_plan *p, int first_rank, int count, worker_status *out) {
    int best = -1;
    worker_status s;
    for (int pass = 0; pass < 2 && best < 0; pass++) {
        for (int r = first_rank; r < first_rank + count; r++) {
            if (launch_read_status(p->status_dir, r, &s) != 0 || s.code == 0) continue;
            if (pass == 0 && s.stopped) continue;
            if (best < 0 || s.time < out->time) { *out = s; best = r; }
        }
    }
    return best;
}

const char *launch_signal_name(int sig) {
    switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGKILL: return "SIGKILL";
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGHUP: return "SIGHUP";
    case SIGFPE: return "SIGFPE";
    default: return "signal";
    }
}

void launch_report_failure(const launch_opts *o, const worker_status *s) {
    char logs[LAUNCH_PATH_MAX + 64] = "";
    if (o->log_dir[0]) snprintf(logs, sizeof logs, " (log: %s/rank_%d.log)", o->log_dir, s->rank);
    if (s->hung)
        fprintf(stderr, "shardlm launch: rank %d on host %s hung: no heartbeat for %.1f s (last: %s); it was killed and the "
                "job stopped, exit code %d%s\n", s->rank, s->host, s->silent_s, s->progress, s->code, logs);
    else if (s->sig)
        fprintf(stderr, "shardlm launch: rank %d on host %s was killed by signal %d (%s), exit code %d%s\n", s->rank, s->host,
                s->sig, launch_signal_name(s->sig), s->code, logs);
    else
        fprintf(stderr, "shardlm launch: rank %d on host %s exited with code %d%s\n", s->rank, s->host, s->code, logs);
}
