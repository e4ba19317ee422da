// launch_supervise.c: parent-death signals and heartbeat watching for `shardlm launch` (see
// launch_supervise.h).
#include "cli/launch_supervise.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

int sl_die_with_parent(int sig, pid_t parent_pid) {
    if (prctl(PR_SET_PDEATHSIG, sig) != 0) return -1;
    // the parent may have died between fork and prctl: then no signal will ever come
    return getppid() == parent_pid ? 0 : -1;
}

void sl_hang_watch_init(sl_hang_watch *w, const char *dir, int rank, int timeout_s) {
    memset(w, 0, sizeof *w);
    w->timeout_s = dir ? timeout_s : 0;
    if (w->timeout_s <= 0) return;
    snprintf(w->path, sizeof w->path, "%s/.heartbeat_%d", dir, rank);
    unlink(w->path);
}

void sl_hang_watch_export(const sl_hang_watch *w) {
    if (w->timeout_s <= 0) return;
    long interval_ms = w->timeout_s * 100L;
    if (interval_ms < 100) interval_ms = 100;
    if (interval_ms > 5000) interval_ms = 5000;
    char v[32];
    setenv("SHARDLM_HEARTBEAT_FILE", w->path, 1);
    snprintf(v, sizeof v, "%ld", interval_ms);
    setenv("SHARDLM_HEARTBEAT_INTERVAL_MS", v, 1);
    snprintf(v, sizeof v, "%d", w->timeout_s);
    setenv("SHARDLM_HANG_TIMEOUT", v, 1);
}

int sl_hang_watch_tripped(sl_hang_watch *w, int rank, const char *host, double now) {
    if (w->timeout_s <= 0) return 0;
    char rec[sizeof w->record];
    int fd = open(w->path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, rec, sizeof rec - 1) : -1;
    if (fd >= 0) close(fd);
    if (n > 0) {
        rec[n] = '\0';
        if (!w->watching || strcmp(rec, w->record) != 0) {
            memcpy(w->record, rec, (size_t)n + 1);
            w->last_change = now;
            w->watching = 1;
        }
    }
    if (!w->watching) return 0;  // a program that never beats is never called hung
    w->silent_s = now - w->last_change;
    if (w->silent_s <= w->timeout_s) return 0;
    char last[SL_HEARTBEAT_RECORD + 1];
    sl_hang_watch_last_progress(w, last, sizeof last);
    fprintf(stderr, "shardlm launch: rank %d on host %s: no heartbeat for %.1f s (--hang-timeout %d; last: %s); killing it\n",
            rank, host, w->silent_s, w->timeout_s, last);
    return 1;
}

void sl_hang_watch_last_progress(const sl_hang_watch *w, char *buf, size_t cap) {
    const char *s = strstr(w->record, " step ");
    if (!s) { snprintf(buf, cap, "no step reported"); return; }
    snprintf(buf, cap, "%s", s + 1);
    size_t n = strlen(buf);
    while (n > 0 && (buf[n - 1] == ' ' || buf[n - 1] == '\n')) buf[--n] = '\0';
}
