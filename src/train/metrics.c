// metrics.c: JSON-lines metrics file and the human progress line (see metrics.h).
// Invariants: every record is one complete line of valid JSON (non-finite numbers become null,
// keys are escaped), written with a single fputs and flushed before returning, so a crash leaves
// at most a truncated last line; the progress line never writes '\r' to a non-terminal.
#include "shardlm/metrics.h"
#include "shardlm/settings.h"
#include "shardlm/error.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct sl_metrics {
    FILE *f;
    char path[512];
};

sl_metrics *sl_metrics_open(const char *path) {
    sl_metrics *m = sl_calloc(1, sizeof *m, "metrics log");
    if (!m) return NULL;
    m->f = fopen(path, "a");
    if (!m->f) {
        sl_errorf("cannot open metrics file %s for appending: %s", path, strerror(errno));
        free(m);
        return NULL;
    }
    snprintf(m->path, sizeof m->path, "%s", path);
    return m;
}

// Appends `s` as a JSON string (quoted, escaped) to buf at *len, never past cap.
static void append_json_string(char *buf, size_t cap, size_t *len, const char *s) {
    size_t n = *len;
    if (n < cap) buf[n] = '"';
    n++;
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char esc[8];
        if (*c == '"' || *c == '\\') snprintf(esc, sizeof esc, "\\%c", *c);
        else if (*c < 0x20) snprintf(esc, sizeof esc, "\\u%04x", *c);
        else esc[0] = (char)*c, esc[1] = '\0';
        for (char *e = esc; *e; e++, n++)
            if (n < cap) buf[n] = *e;
    }
    if (n < cap) buf[n] = '"';
    n++;
    *len = n;
}

static void append_text(char *buf, size_t cap, size_t *len, const char *fmt_out) {
    for (const char *c = fmt_out; *c; c++, (*len)++)
        if (*len < cap) buf[*len] = *c;
}

int sl_metrics_log(sl_metrics *m, int64_t step, int n, const char *const *keys, const double *values) {
    char line[4096], num[64];
    size_t len = 0;
    snprintf(num, sizeof num, "{\"step\":%" PRId64, step);
    append_text(line, sizeof line, &len, num);
    for (int i = 0; i < n; i++) {
        append_text(line, sizeof line, &len, ",");
        append_json_string(line, sizeof line, &len, keys[i]);
        if (isfinite(values[i])) snprintf(num, sizeof num, ":%.9g", values[i]);
        else snprintf(num, sizeof num, ":null");
        append_text(line, sizeof line, &len, num);
    }
    append_text(line, sizeof line, &len, "}\n");
    if (len >= sizeof line) return sl_errorf("metrics record for step %" PRId64 " is too long (%zu bytes)", step, len);
    line[len] = '\0';
    if (fputs(line, m->f) == EOF || fflush(m->f) != 0)
        return sl_errorf("writing metrics file %s: %s", m->path, strerror(errno));
    return 0;
}

int sl_metrics_log_train(sl_metrics *m, int64_t step, double loss, double lr, double tokens_per_s,
                         double elapsed_s) {
    static const char *const keys[] = {"loss", "lr", "tokens_per_s", "elapsed_s"};
    const double values[] = {loss, lr, tokens_per_s, elapsed_s};
    return sl_metrics_log(m, step, 4, keys, values);
}

int sl_metrics_log_val(sl_metrics *m, int64_t step, double val_loss) {
    static const char *const keys[] = {"val_loss"};
    return sl_metrics_log(m, step, 1, keys, &val_loss);
}

int sl_metrics_close(sl_metrics *m) {
    if (!m) return 0;
    int rc = fclose(m->f) == 0 ? 0 : sl_errorf("closing metrics file %s: %s", m->path, strerror(errno));
    free(m);
    return rc;
}

// ---- progress ----------------------------------------------------------------------------------

void sl_format_duration(char *buf, size_t cap, double seconds) {
    if (!(seconds >= 0.0) || !isfinite(seconds) || seconds > 1e12) { snprintf(buf, cap, "?"); return; }
    long long s = llround(seconds);
    if (s < 60) snprintf(buf, cap, "%llds", s);
    else if (s < 3600) snprintf(buf, cap, "%lldm%02llds", s / 60, s % 60);
    else if (s < 86400) snprintf(buf, cap, "%lldh%02lldm", s / 3600, (s % 3600) / 60);
    else snprintf(buf, cap, "%lldd%02lldh", s / 86400, (s % 86400) / 3600);
}

void sl_format_count(char *buf, size_t cap, double value) {
    if (!isfinite(value) || fabs(value) > 9e18) { snprintf(buf, cap, "?"); return; }
    long long v = llround(value);
    char digits[32];
    snprintf(digits, sizeof digits, "%lld", v < 0 ? -v : v);
    char out[48];
    size_t n = 0, len = strlen(digits);
    if (v < 0) out[n++] = '-';
    for (size_t i = 0; i < len; i++) {
        if (i > 0 && (len - i) % 3 == 0) out[n++] = ',';
        out[n++] = digits[i];
    }
    out[n] = '\0';
    snprintf(buf, cap, "%s", out);
}

double sl_eta_seconds(int64_t steps_done, int64_t total_steps, double elapsed_s) {
    if (steps_done <= 0 || total_steps <= 0) return -1.0;
    if (steps_done >= total_steps) return 0.0;
    return elapsed_s / (double)steps_done * (double)(total_steps - steps_done);
}

int sl_format_progress(char *buf, size_t cap, int64_t step, int64_t total_steps, double loss, double lr,
                       double tokens_per_s, double eta_s) {
    char tok[48], eta[32], steps[64];
    sl_format_count(tok, sizeof tok, tokens_per_s);
    sl_format_duration(eta, sizeof eta, eta_s);
    if (total_steps > 0) snprintf(steps, sizeof steps, "%" PRId64 "/%" PRId64, step, total_steps);
    else snprintf(steps, sizeof steps, "%" PRId64, step);
    if (total_steps > 0)
        return snprintf(buf, cap, "step %s | loss %.4f | lr %.2e | %s tok/s | ETA %s", steps, loss, lr, tok, eta);
    return snprintf(buf, cap, "step %s | loss %.4f | lr %.2e | %s tok/s", steps, loss, lr, tok);
}

void sl_progress_init(sl_progress *p, FILE *stream) {
    p->stream = stream;
    // SHARDLM_TERMINAL=0: `shardlm launch` says the output does not end on a terminal, although this
    // rank's stdout may be one (mpirun gives each rank a pseudo-terminal)
    p->is_tty = isatty(fileno(stream)) && sl_settings_get()->terminal ? 1 : 0;
    p->live = 0;
}

void sl_progress_update(sl_progress *p, const char *line) {
    if (p->is_tty) {
        fprintf(p->stream, "\r%s\033[K", line);  // carriage return, line, clear to end of line
        p->live = 1;
    } else {
        fprintf(p->stream, "%s\n", line);
    }
    fflush(p->stream);
}

void sl_progress_message(sl_progress *p, const char *line) {
    if (p->is_tty && p->live) fprintf(p->stream, "\r\033[K");
    fprintf(p->stream, "%s\n", line);
    p->live = 0;
    fflush(p->stream);
}

void sl_progress_finish(sl_progress *p) {
    if (p->is_tty && p->live) fputc('\n', p->stream);
    p->live = 0;
    fflush(p->stream);
}
