// fuzz_common.h: what the libFuzzer targets share. The parsers under test read files, so each input
// is written to a file in a private temporary directory first. Built by `make fuzz` (clang,
// -fsanitize=fuzzer,address,undefined) and run for a bounded time by tests/cli/test_fuzz.sh.
#ifndef SHARDLM_FUZZ_COMMON_H
#define SHARDLM_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// The directory this fuzzing process writes its inputs to (created once, removed at exit).
static char fuzz_dir[512];

static inline void fuzz_cleanup(void) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_dir);
    if (fuzz_dir[0] && system(cmd) != 0) fprintf(stderr, "fuzz: could not remove %s\n", fuzz_dir);
}

static inline const char *fuzz_tmpdir(void) {
    if (!fuzz_dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(fuzz_dir, sizeof fuzz_dir, "%s/shardlm_fuzz_XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(fuzz_dir)) { perror("mkdtemp"); abort(); }
        atexit(fuzz_cleanup);
    }
    return fuzz_dir;
}

// Writes bytes to fuzz_tmpdir()/name; returns the path (a static buffer per call site's `out`).
static inline const char *fuzz_write(const char *name, const void *data, size_t size, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", fuzz_tmpdir(), name);
    FILE *f = fopen(out, "wb");
    if (!f) { perror(out); abort(); }
    if (size && fwrite(data, 1, size, f) != size) { perror(out); abort(); }
    fclose(f);
    return out;
}

// A NUL-terminated copy of the input (for the text parsers).
static inline char *fuzz_text(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) abort();
    memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

#endif
