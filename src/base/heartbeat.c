// heartbeat.c: the background thread behind heartbeat.h.
#include "shardlm/heartbeat.h"
#include "shardlm/settings.h"
#include "shardlm/error.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct {
    int fd, running;
    long interval_ms;
    unsigned long long beats;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    atomic_int stop;
    _Atomic int64_t step;
    _Atomic(const char *) what;
} hb = {.fd = -1, .mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static void write_beat(void) {
    char rec[SL_HEARTBEAT_RECORD + 1];
    int n = snprintf(rec, sizeof rec, "beat %llu pid %ld step %lld %.40s", ++hb.beats, (long)getpid(),
                     (long long)atomic_load(&hb.step), atomic_load(&hb.what));
    if (n < 0) return;
    if (n > SL_HEARTBEAT_RECORD - 1) n = SL_HEARTBEAT_RECORD - 1;
    memset(rec + n, ' ', (size_t)(SL_HEARTBEAT_RECORD - 1 - n));
    rec[SL_HEARTBEAT_RECORD - 1] = '\n';
    // one record at offset 0; a failed write is a missed beat, which is what the launcher watches for
    if (pwrite(hb.fd, rec, SL_HEARTBEAT_RECORD, 0) < 0) return;
}

static void *beat_loop(void *arg) {
    (void)arg;
    while (!atomic_load(&hb.stop)) {
        write_beat();  // outside the lock: a write that hangs must not block sl_heartbeat_stop's signal
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += hb.interval_ms / 1000;
        until.tv_nsec += (hb.interval_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
        pthread_mutex_lock(&hb.mu);
        while (!atomic_load(&hb.stop) && pthread_cond_timedwait(&hb.wake, &hb.mu, &until) != ETIMEDOUT) {}
        pthread_mutex_unlock(&hb.mu);
    }
    return NULL;
}

int sl_heartbeat_start(void) {
    const sl_settings *s = sl_settings_get();
    const char *path = s->heartbeat_file;
    if (!path[0] || hb.running) return 0;
    hb.interval_ms = s->heartbeat_interval_ms;
    hb.fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (hb.fd < 0) return sl_errorf("heartbeat file %s: %s", path, strerror(errno));
    atomic_store(&hb.stop, 0);
    if (!atomic_load(&hb.what)) atomic_store(&hb.what, "starting");
    // the thread takes no signals: the training loop's SIGINT/SIGTERM handling stays on the main thread
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&hb.thread, NULL, beat_loop, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        close(hb.fd);
        hb.fd = -1;
        return sl_errorf("heartbeat thread: %s", strerror(rc));
    }
    hb.running = 1;
    return 0;
}

void sl_heartbeat_progress(int64_t step, const char *what) {
    atomic_store(&hb.step, step);
    atomic_store(&hb.what, what);
}

void sl_heartbeat_stop(void) {
    if (!hb.running) return;
    pthread_mutex_lock(&hb.mu);
    atomic_store(&hb.stop, 1);
    pthread_cond_signal(&hb.wake);
    pthread_mutex_unlock(&hb.mu);
    pthread_join(hb.thread, NULL);
    close(hb.fd);
    hb.fd = -1;
    hb.running = 0;
}
