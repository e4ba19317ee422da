// log.h: rank-aware logging. After sl_log_init, only rank 0 prints (debug/info to stdout,
// warnings/errors to stderr) unless all_ranks is set, in which case every rank prints with a
// "[rank N] " prefix. Errors are printed by every rank, so a failure on rank 3 is never silent.
// With a log directory, every rank also appends every message at or above the level to
// LOGDIR/rank_N.log (line-buffered, with a timestamp). Before sl_log_init, sl_log prints like a
// single process. Call from one thread at a time for init/close; sl_log itself is safe to call
// from any thread (stdio locks each line).
#ifndef SHARDLM_LOG_H
#define SHARDLM_LOG_H

typedef enum { SL_LOG_DEBUG = 0, SL_LOG_INFO = 1, SL_LOG_WARN = 2, SL_LOG_ERROR = 3 } sl_log_level;

// Creates log_dir (and parents) when given; returns -1 with a message if its file cannot be opened.
int sl_log_init(int rank, int world, const char *log_dir, int all_ranks);
// Messages below `level` are dropped (default SL_LOG_INFO; SHARDLM_LOG_LEVEL=debug|info|warn|error
// in the environment sets it at sl_log_init).
void sl_log_set_level(sl_log_level level);
void sl_log(sl_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Closes the rank's log file and returns to single-process printing.
void sl_log_close(void);

#endif
