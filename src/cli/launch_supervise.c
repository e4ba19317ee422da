// launch_supervise.c: what supervises a `shardlm launch` job's processes (see launch_supervise.h):
// forwarded signals recorded by their handlers, parent-death signals, heartbeat watching, and the
// small process helpers (clock, sleep, exit codes, directories) the launcher's loops share.
#include "cli/launch.h"
#include "cli/launch_supervise.h"
#include "shardlm/error.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

// ---- signals: handlers only record which signals arrived; loops forward them

static const int forwarded_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2};
enum { N_FORWARDED = sizeof forwarded_signals / sizeof forwarded_signals[0] };
static volatile sig_atomic_t pending_signal[N_FORWARDED];
static volatile sig_atomic_t first_signal;

static void on_forwarded_signal(int sig) {
    for (int i = 0; i < N_FORWARDED; i++)
        if (forwarded_signals[i] == sig) pending_signal[i] = 1;
    if (!first_signal) first_signal = sig;
}

void launch_install_forwarding(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_forwarded_signal;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < N_FORWARDED; i++) sigaction(forwarded_signals[i], &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

void launch_reset_signals(void) {
    for (int i = 0; i < N_FORWARDED; i++) signal(forwarded_signals[i], SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

int launch_take_pending_signal(void) {
    for (int i = 0; i < N_FORWARDED; i++)
        if (pending_signal[i]) { pending_signal[i] = 0; return forwarded_signals[i]; }
    return 0;
}

void launch_forwarded_sigset(sigset_t *set) {
    sigemptyset(set);
    for (int i = 0; i < N_FORWARDED; i++) sigaddset(set, forwarded_signals[i]);
}

void launch_clear_pending_signals(void) {
    for (int i = 0; i < N_FORWARDED; i++) pending_signal[i] = 0;
}

int launch_first_signal(void) { return first_signal; }

// ---- process helpers

double launch_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void launch_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);  // EINTR is fine: the caller's loop re-checks
}

int launch_exit_code_of(int wstatus) {
    if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
    if (WIFSIGNALED(wstatus)) return 128 + WTERMSIG(wstatus);
    return 1;
}

int launch_mkdir_p(const char *path) {
    char buf[LAUNCH_PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return sl_errorf("path too long: %s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return sl_errorf("cannot create directory %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) return sl_errorf("cannot create directory %s: %s", buf, strerror(errno));
    return 0;
}

// ---- parent death and heartbeats

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
