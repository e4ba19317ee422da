// test.h: a minimal test harness. Each tests/unit/test_*.c is one binary; TEST(name) defines a case,
// CHECK* record failures without stopping the case, and TEST_MAIN() runs every case, printing one
// line per case ("PASS name" / "FAIL name") that tests/run.sh counts.
#ifndef SHARDLM_TEST_H
#define SHARDLM_TEST_H

#include "shardlm/fileio.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*test_fn)(void);
typedef struct { const char *name; test_fn fn; } test_case;

#define TEST_MAX 256
static test_case test_cases[TEST_MAX];
static int test_count;
static int test_failed_checks;

#define TEST(name)                                                                  \
    static void name(void);                                                         \
    __attribute__((constructor)) static void register_##name(void) {                \
        if (test_count < TEST_MAX) test_cases[test_count++] = (test_case){#name, name}; \
    }                                                                               \
    static void name(void)

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);     \
            test_failed_checks++;                                                          \
        }                                                                                  \
    } while (0)

#define CHECK_MSG(cond, ...)                                                               \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "  %s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);     \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fprintf(stderr, "\n");                                                         \
            test_failed_checks++;                                                          \
        }                                                                                  \
    } while (0)

// |a - b| <= tol * max(1, |b|): relative for large values, absolute near zero.
#define CHECK_CLOSE(a, b, tol)                                                             \
    do {                                                                                   \
        double ca_ = (double)(a), cb_ = (double)(b);                                       \
        double lim_ = (tol) * (fabs(cb_) > 1.0 ? fabs(cb_) : 1.0);                         \
        if (!(fabs(ca_ - cb_) <= lim_)) {                                                  \
            fprintf(stderr, "  %s:%d: %s = %.9g, expected %s = %.9g (tol %g)\n", __FILE__, \
                    __LINE__, #a, ca_, #b, cb_, (double)(tol));                            \
            test_failed_checks++;                                                          \
        }                                                                                  \
    } while (0)

// A host fp32 array handed to an op as activation storage (ops.h sl_act: fp32 on the cpu table).
#define ACT(p)                                                   \
    _Generic((p), float *: (sl_act *)(void *)(p),                \
             const float *: (const sl_act *)(const void *)(p),   \
             void *: (sl_act *)(p), const void *: (const sl_act *)(p))

// FNV-1a 64 (fileio.h's sl_fnv1a64) over token ids written as little-endian uint32: how the tokenizer
// fixtures (tests/reference/make_tokenizer*_fixtures.py) fingerprint a whole file's ids.
static inline uint64_t test_fnv1a_ids(const int32_t *ids, size_t n) {
    unsigned long long h = SL_FNV1A64_INIT;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ids[i];
        const unsigned char le[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                                     (unsigned char)(v >> 24)};
        h = sl_fnv1a64(h, le, 4);
    }
    return h;
}

// Where shared test inputs live: ../shared/data relative to the repository root.
static inline const char *test_data_dir(void) {
    const char *d = getenv("SHARDLM_DATA");
    return d ? d : "../shared/data";
}

#define TEST_MAIN()                                                                 \
    int main(void) {                                                                \
        int failed = 0;                                                             \
        for (int i = 0; i < test_count; i++) {                                      \
            test_failed_checks = 0;                                                 \
            test_cases[i].fn();                                                     \
            printf("%s %s\n", test_failed_checks ? "FAIL" : "PASS", test_cases[i].name); \
            fflush(stdout);                                                         \
            failed += test_failed_checks != 0;                                      \
        }                                                                           \
        return failed ? 1 : 0;                                                      \
    }

#endif
