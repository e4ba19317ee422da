// metrics.h: the training log. A metrics file holds JSON lines, one object per line, appended and
// flushed on every write, e.g.
//   {"step":12,"loss":4.1234,"lr":0.0006,"tokens_per_s":12345.6,"elapsed_s":61.2}
//   {"step":100,"val_loss":3.98}
// and the human progress line "step 12/200 | loss 4.1234 | lr 6.00e-04 | 12,345 tok/s | ETA 1m23s",
// rewritten in place ('\r') on a terminal and printed as plain lines otherwise (logs, pipes, CI).
#ifndef SHARDLM_METRICS_H
#define SHARDLM_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct sl_metrics sl_metrics;

// Opens (creating if needed) `path` for appending. NULL with an error naming the path on failure.
sl_metrics *sl_metrics_open(const char *path);

// One object {"step": step, keys[i]: values[i]...}; non-finite values are written as null (JSON has
// no NaN). Keys are escaped. Returns -1 (error names the file) if the write or flush fails.
int sl_metrics_log(sl_metrics *m, int64_t step, int n, const char *const *keys, const double *values);

// {"step","loss","lr","tokens_per_s","elapsed_s"}
int sl_metrics_log_train(sl_metrics *m, int64_t step, double loss, double lr, double tokens_per_s,
                         double elapsed_s);
// {"step","val_loss"}
int sl_metrics_log_val(sl_metrics *m, int64_t step, double val_loss);

// Closes the file (NULL is fine); -1 if the final close fails.
int sl_metrics_close(sl_metrics *m);

// ---- human-readable progress -------------------------------------------------------------------

// "45s", "1m23s", "2h05m", "3d04h"; "?" when unknown (negative, NaN, infinite).
void sl_format_duration(char *buf, size_t cap, double seconds);

// Rounded to an integer with thousands separators: 12345.6 -> "12,346".
void sl_format_count(char *buf, size_t cap, double value);

// Seconds left, assuming the remaining steps take as long as the finished ones did on average;
// -1 when unknown (no step done yet).
double sl_eta_seconds(int64_t steps_done, int64_t total_steps, double elapsed_s);

// "step 12/200 | loss 4.1234 | lr 6.00e-04 | 12,345 tok/s | ETA 1m23s" (total_steps <= 0 drops
// "/total" and the ETA). Returns the length snprintf would write.
int sl_format_progress(char *buf, size_t cap, int64_t step, int64_t total_steps, double loss, double lr,
                       double tokens_per_s, double eta_s);

typedef struct {
    FILE *stream;
    int is_tty;    // isatty(stream) at init, unless SHARDLM_TERMINAL=0: live line rewritten with '\r'
    int live;      // a live line is on screen (no newline after it yet)
} sl_progress;

void sl_progress_init(sl_progress *p, FILE *stream);
// Shows `line`: on a terminal it replaces the current live line; otherwise prints it as a line.
void sl_progress_update(sl_progress *p, const char *line);
// Prints a permanent line (validation loss, a checkpoint note) without garbling the live line.
void sl_progress_message(sl_progress *p, const char *line);
// Ends the live line with a newline (terminal only).
void sl_progress_finish(sl_progress *p);

#endif
