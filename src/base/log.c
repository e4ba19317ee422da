// log.c: rank-aware logging (log.h). Owns the process's logging state: rank, world size, whether
// every rank prints, the minimum level, and the rank's log file.
//
// Invariants: a message goes to the console at most once and to the rank's file at most once; a
// message never exceeds one line per call as written (the caller's text plus one '\n' if it lacks
// one); the file, when open, is line-buffered so a crash loses at most a partial line.
#include "shardlm/settings.h"
#include "shardlm/log.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "shardlm/error.h"

static int log_rank = 0, log_world = 1, log_all_ranks = 0;
static sl_log_level log_level = SL_LOG_INFO;
static FILE *log_file = NULL;

static const char *level_tag(sl_log_level level) {
    switch (level) {
    case SL_LOG_DEBUG: return "debug: ";
    case SL_LOG_INFO: return "";
    case SL_LOG_WARN: return "warning: ";
    case SL_LOG_ERROR: return "error: ";
    }
    return "";
}

static int mkdir_p(const char *dir) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) return sl_errorf("log directory name too long: %s", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(path, 0777) && errno != EEXIST) return sl_errorf("creating log directory %s: %s", path, strerror(errno));
        *p = '/';
    }
    if (mkdir(path, 0777) && errno != EEXIST) return sl_errorf("creating log directory %s: %s", path, strerror(errno));
    return 0;
}

void sl_log_set_level(sl_log_level level) { log_level = level; }

void sl_log_close(void) {
    if (log_file) fclose(log_file);
    log_file = NULL;
    log_rank = 0;
    log_world = 1;
    log_all_ranks = 0;
}

int sl_log_init(int rank, int world, const char *log_dir, int all_ranks) {
    sl_log_close();
    if (world < 1 || rank < 0 || rank >= world) return sl_errorf("sl_log_init: rank %d of world size %d", rank, world);
    log_rank = rank;
    log_world = world;
    log_all_ranks = all_ranks != 0;
    if (getenv("SHARDLM_LOG_LEVEL") && sl_settings_load()) return -1;  // a malformed level is an error here
    log_level = (sl_log_level)sl_settings_get()->log_level;
    if (log_dir && *log_dir) {
        if (mkdir_p(log_dir)) return -1;
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/rank_%d.log", log_dir, rank) >= (int)sizeof path)
            return sl_errorf("log file name too long in %s", log_dir);
        log_file = fopen(path, "a");
        if (!log_file) return sl_errorf("opening log file %s: %s", path, strerror(errno));
        setvbuf(log_file, NULL, _IOLBF, 0);
    }
    return 0;
}

void sl_log(sl_log_level level, const char *fmt, ...) {
    if (level < log_level) return;
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t n = strlen(msg);
    const char *nl = (n > 0 && msg[n - 1] == '\n') ? "" : "\n";
    char prefix[32] = "";
    if (log_world > 1 && (log_all_ranks || level == SL_LOG_ERROR)) snprintf(prefix, sizeof prefix, "[rank %d] ", log_rank);
    if (log_rank == 0 || log_all_ranks || level == SL_LOG_ERROR) {
        FILE *out = level >= SL_LOG_WARN ? stderr : stdout;
        fprintf(out, "%s%s%s%s", prefix, level_tag(level), msg, nl);
        fflush(out);
    }
    if (log_file) {
        char stamp[32];
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
        fprintf(log_file, "%s [rank %d] %s%s%s", stamp, log_rank, level_tag(level), msg, nl);
    }
}
