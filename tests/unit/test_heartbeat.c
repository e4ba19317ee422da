// test_heartbeat.c: the rank side of `shardlm launch --hang-timeout` (heartbeat.h): nothing happens
// without SHARDLM_HEARTBEAT_FILE; with it a background thread rewrites one fixed-size record carrying
// a changing beat counter, the pid and the last reported progress, keeps beating while the main
// thread does nothing, and stops (the record no longer changes) after sl_heartbeat_stop.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shardlm/heartbeat.h"
#include "shardlm/settings.h"
#include "test.h"

static void nap_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int read_record(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return (int)n;
}

TEST(no_file_variable_means_no_heartbeat) {
    unsetenv("SHARDLM_HEARTBEAT_FILE");
    sl_settings_load();  // the environment is read once; again after changing it
    CHECK(sl_heartbeat_start() == 0);
    sl_heartbeat_progress(3, "training");
    sl_heartbeat_stop();
}

TEST(thread_beats_while_main_thread_waits_and_stops_on_request) {
    char path[] = "/tmp/shardlm_test_heartbeat_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    close(fd);
    setenv("SHARDLM_HEARTBEAT_FILE", path, 1);
    setenv("SHARDLM_HEARTBEAT_INTERVAL_MS", "20", 1);
    sl_settings_load();  // the environment is read once; again after changing it
    sl_heartbeat_progress(7, "checkpoint save");
    CHECK(sl_heartbeat_start() == 0);
    char a[256], b[256], want[64];
    nap_ms(100);  // the main thread "blocks" (a long collective or save): beats go on
    CHECK(read_record(path, a, sizeof a) == SL_HEARTBEAT_RECORD);
    nap_ms(100);
    CHECK(read_record(path, b, sizeof b) == SL_HEARTBEAT_RECORD);
    CHECK_MSG(strcmp(a, b) != 0, "record did not change: %s", b);
    snprintf(want, sizeof want, " pid %ld step 7 checkpoint save ", (long)getpid());
    CHECK_MSG(strncmp(b, "beat ", 5) == 0 && strstr(b, want) != NULL, "record: %s", b);
    CHECK(b[SL_HEARTBEAT_RECORD - 1] == '\n');
    sl_heartbeat_progress(8, "training");
    nap_ms(100);
    CHECK(read_record(path, b, sizeof b) == SL_HEARTBEAT_RECORD);
    CHECK_MSG(strstr(b, " step 8 training ") != NULL, "record: %s", b);
    sl_heartbeat_stop();
    CHECK(read_record(path, a, sizeof a) == SL_HEARTBEAT_RECORD);
    nap_ms(100);
    CHECK(read_record(path, b, sizeof b) == SL_HEARTBEAT_RECORD);
    CHECK_MSG(strcmp(a, b) == 0, "record changed after stop: %s / %s", a, b);
    unsetenv("SHARDLM_HEARTBEAT_FILE");
    unsetenv("SHARDLM_HEARTBEAT_INTERVAL_MS");
    sl_settings_load();  // the environment is read once; again after changing it
    unlink(path);
}

TEST(unwritable_file_is_an_error_not_an_exit) {
    setenv("SHARDLM_HEARTBEAT_FILE", "/nonexistent-dir/heartbeat", 1);
    sl_settings_load();  // the environment is read once; again after changing it
    CHECK(sl_heartbeat_start() == -1);
    sl_heartbeat_stop();
    unsetenv("SHARDLM_HEARTBEAT_FILE");
    sl_settings_load();  // the environment is read once; again after changing it
}

TEST_MAIN()
