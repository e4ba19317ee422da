// test_metrics.c: the JSON-lines metrics file (every line parses back with cJSON, appends across
// opens, non-finite values become null, keys are escaped), duration / count / progress formatting,
// and the terminal vs plain progress output.
#include "test.h"

#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/metrics.h"

#include <cjson/cJSON.h>
#include <unistd.h>

static void temp_path(char *buf, size_t cap, const char *name) {
    const char *dir = getenv("TMPDIR");
    snprintf(buf, cap, "%s/shardlm_test_metrics_%d_%s", dir ? dir : "/tmp", (int)getpid(), name);
}

TEST(json_lines_parse_back) {
    char path[512];
    temp_path(path, sizeof path, "a.jsonl");
    unlink(path);
    sl_metrics *m = sl_metrics_open(path);
    CHECK_MSG(m != NULL, "%s", sl_error());
    if (!m) return;
    CHECK(sl_metrics_log_train(m, 1, 4.5, 6e-4, 12345.5, 0.25) == 0);
    CHECK(sl_metrics_log_val(m, 1, NAN) == 0);
    CHECK(sl_metrics_close(m) == 0);
    m = sl_metrics_open(path);  // reopening appends
    CHECK(m != NULL);
    if (!m) return;
    const char *keys[] = {"we\"ird\\key\n", "grad_norm"};
    const double values[] = {1.0, INFINITY};
    CHECK(sl_metrics_log(m, 2, 2, keys, values) == 0);
    CHECK(sl_metrics_log_val(m, 200, 3.25) == 0);
    CHECK(sl_metrics_close(m) == 0);

    char *text = sl_read_text_file(path, NULL);
    CHECK(text != NULL);
    if (!text) return;
    int lines = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        cJSON *o = cJSON_Parse(line);
        CHECK_MSG(o != NULL && cJSON_IsObject(o), "line %d does not parse: %s", lines, line);
        if (!o) continue;
        CHECK(cJSON_IsNumber(cJSON_GetObjectItem(o, "step")));
        if (lines == 0) {
            CHECK(cJSON_GetObjectItem(o, "step")->valueint == 1);
            CHECK(cJSON_GetObjectItem(o, "loss")->valuedouble == 4.5);
            CHECK(cJSON_GetObjectItem(o, "lr")->valuedouble == 6e-4);
            CHECK(cJSON_GetObjectItem(o, "tokens_per_s")->valuedouble == 12345.5);
            CHECK(cJSON_GetObjectItem(o, "elapsed_s")->valuedouble == 0.25);
        } else if (lines == 1) {
            CHECK(cJSON_IsNull(cJSON_GetObjectItem(o, "val_loss")));
        } else if (lines == 2) {
            CHECK(cJSON_GetObjectItemCaseSensitive(o, "we\"ird\\key\n") != NULL);
            CHECK(cJSON_IsNull(cJSON_GetObjectItem(o, "grad_norm")));
        } else if (lines == 3) {
            CHECK(cJSON_GetObjectItem(o, "step")->valueint == 200);
            CHECK(cJSON_GetObjectItem(o, "val_loss")->valuedouble == 3.25);
        }
        cJSON_Delete(o);
    }
    CHECK(lines == 4);
    free(text);
    unlink(path);
}

TEST(open_failure_names_path) {
    sl_metrics *m = sl_metrics_open("/nonexistent-dir-shardlm/x.jsonl");
    CHECK(m == NULL);
    CHECK(strstr(sl_error(), "/nonexistent-dir-shardlm/x.jsonl") != NULL);
    CHECK(sl_metrics_close(NULL) == 0);
}

TEST(duration_formatting) {
    char b[32];
    sl_format_duration(b, sizeof b, 0.0); CHECK(strcmp(b, "0s") == 0);
    sl_format_duration(b, sizeof b, 45.4); CHECK(strcmp(b, "45s") == 0);
    sl_format_duration(b, sizeof b, 59.6); CHECK(strcmp(b, "1m00s") == 0);
    sl_format_duration(b, sizeof b, 83.0); CHECK(strcmp(b, "1m23s") == 0);
    sl_format_duration(b, sizeof b, 3599.0); CHECK(strcmp(b, "59m59s") == 0);
    sl_format_duration(b, sizeof b, 7500.0); CHECK(strcmp(b, "2h05m") == 0);
    sl_format_duration(b, sizeof b, 2 * 86400.0 + 4 * 3600 + 59); CHECK(strcmp(b, "2d04h") == 0);
    sl_format_duration(b, sizeof b, -1.0); CHECK(strcmp(b, "?") == 0);
    sl_format_duration(b, sizeof b, NAN); CHECK(strcmp(b, "?") == 0);
    sl_format_duration(b, sizeof b, INFINITY); CHECK(strcmp(b, "?") == 0);
}

TEST(count_formatting) {
    char b[32];
    sl_format_count(b, sizeof b, 0); CHECK(strcmp(b, "0") == 0);
    sl_format_count(b, sizeof b, 999); CHECK(strcmp(b, "999") == 0);
    sl_format_count(b, sizeof b, 1000); CHECK(strcmp(b, "1,000") == 0);
    sl_format_count(b, sizeof b, 12345.4); CHECK(strcmp(b, "12,345") == 0);
    sl_format_count(b, sizeof b, 1234567.0); CHECK(strcmp(b, "1,234,567") == 0);
    sl_format_count(b, sizeof b, -45678.0); CHECK(strcmp(b, "-45,678") == 0);
    sl_format_count(b, sizeof b, NAN); CHECK(strcmp(b, "?") == 0);
}

TEST(eta_and_progress_line) {
    CHECK(sl_eta_seconds(0, 200, 5.0) == -1.0);
    CHECK(sl_eta_seconds(200, 200, 5.0) == 0.0);
    CHECK_CLOSE(sl_eta_seconds(12, 200, 6.0), 94.0, 1e-12);
    char b[256];
    int n = sl_format_progress(b, sizeof b, 12, 200, 4.12341, 6e-4, 12345.0, 83.0);
    CHECK(n == (int)strlen(b));
    CHECK_MSG(strcmp(b, "step 12/200 | loss 4.1234 | lr 6.00e-04 | 12,345 tok/s | ETA 1m23s") == 0, "%s", b);
    sl_format_progress(b, sizeof b, 7, 0, 2.5, 1e-3, 10.0, -1.0);
    CHECK_MSG(strcmp(b, "step 7 | loss 2.5000 | lr 1.00e-03 | 10 tok/s") == 0, "%s", b);
    char small[10];
    n = sl_format_progress(small, sizeof small, 12, 200, 4.0, 6e-4, 1.0, 1.0);
    CHECK(n > 9 && strlen(small) == 9);  // truncated, still terminated
}

static char *read_stream(FILE *f) {
    fflush(f);
    long len = ftell(f);
    rewind(f);
    char *s = calloc((size_t)len + 1, 1);
    if (fread(s, 1, (size_t)len, f) != (size_t)len) s[0] = '\0';
    return s;
}

TEST(progress_plain_and_terminal) {
    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (!f) return;
    sl_progress p;
    sl_progress_init(&p, f);
    CHECK(p.is_tty == 0);  // a file is not a terminal
    sl_progress_update(&p, "step 1");
    sl_progress_update(&p, "step 2");
    sl_progress_message(&p, "val 3.0");
    sl_progress_finish(&p);
    char *s = read_stream(f);
    CHECK_MSG(strcmp(s, "step 1\nstep 2\nval 3.0\n") == 0, "%s", s);
    CHECK(strchr(s, '\r') == NULL);
    free(s);
    fclose(f);

    f = tmpfile();
    if (!f) { CHECK(0); return; }
    sl_progress_init(&p, f);
    p.is_tty = 1;  // pretend: what a terminal would receive
    sl_progress_update(&p, "step 1");
    sl_progress_update(&p, "step 2");
    sl_progress_message(&p, "val 3.0");
    sl_progress_update(&p, "step 3");
    sl_progress_finish(&p);
    s = read_stream(f);
    CHECK_MSG(strcmp(s, "\rstep 1\033[K\rstep 2\033[K\r\033[Kval 3.0\n\rstep 3\033[K\n") == 0, "got %s", s);
    free(s);
    fclose(f);
}

TEST_MAIN()
