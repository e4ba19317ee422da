// mpi_check.h: the shared harness of the multi-process comm tests (tests/mpi/, tests/gpu/). Each
// check records failures with EXPECT on every rank; report() combines them over `check_group`
// (MAX all-reduce) and rank 0 prints one "PASS npN_<prefix><name>" / "FAIL ..." line. The program
// sets check_group (a group every rank belongs to) and check_prefix before its first report().
#ifndef SHARDLM_TESTS_MPI_CHECK_H
#define SHARDLM_TESTS_MPI_CHECK_H

#include <stdint.h>
#include <stdio.h>

#include "shardlm/comm.h"
#include "shardlm/error.h"

static sl_comm *check_group;
static const char *check_prefix = "";
static int rank, size;
static int check_failed, total_failed;

#define EXPECT(cond)                                                                                 \
    do {                                                                                             \
        if (!(cond)) {                                                                               \
            fprintf(stderr, "[rank %d] %s:%d: expected %s (last error: %s)\n", rank, __FILE__, __LINE__, \
                    #cond, sl_error());                                                              \
            check_failed = 1;                                                                        \
        }                                                                                            \
    } while (0)

// Combines this check's result over all ranks and prints one line on rank 0.
static inline void report(const char *name) {
    int32_t f = check_failed;
    if (sl_comm_allreduce(check_group, &f, 1, SL_DTYPE_I32, SL_OP_MAX)) {
        fprintf(stderr, "[rank %d] combining results failed: %s\n", rank, sl_error());
        f = 1;
    }
    if (rank == 0) {
        printf("%s np%d_%s%s\n", f ? "FAIL" : "PASS", size, check_prefix, name);
        fflush(stdout);
    }
    total_failed += f != 0;
    check_failed = 0;
}

// Small integers, so every sum is exact in f32.
static inline int64_t val(int r, size_t i) { return (int64_t)((r * 7 + (int)(i % 1000) * 3) % 11) - 5; }

#endif
