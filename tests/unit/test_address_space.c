// test_address_space.c: the address-space rule of address_space.h. The need grows by one OpenBLAS
// buffer a thread (plus the caller's and the headroom); without RLIMIT_AS anything fits; under a
// limit, a mapping beyond it does not fit and one well within it does, and the trial leaves nothing
// mapped (two trials in a row give the same answer). The limit is set in a forked child, which
// reports through its exit status, so this process keeps its own address space (the ASan build's
// shadow needs it unlimited).
#include "test.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shardlm/address_space.h"

TEST(need_counts_a_buffer_per_thread_one_more_and_the_headroom) {
    CHECK(sl_openblas_need_mib(1) == 2 * SL_OPENBLAS_BUFFER_MIB + SL_ADDRESS_HEADROOM_MIB);
    CHECK(sl_openblas_need_mib(8) - sl_openblas_need_mib(7) == SL_OPENBLAS_BUFFER_MIB);
}

TEST(without_a_limit_everything_fits) {
    struct rlimit rl;
    CHECK(getrlimit(RLIMIT_AS, &rl) == 0);
    if (rl.rlim_cur != RLIM_INFINITY) return;  // the test runner itself is limited: nothing to check here
    long limit = 0;
    CHECK(sl_address_space_fits(1L << 20, &limit) == 1 && limit == -1);  // 1 TiB of PROT_NONE: fits
}

// In a child limited to its current size + 512 MiB: exit status bit 0 = 256 MiB fits, bit 1 = 4 GiB
// fits, bit 2 = 256 MiB fits again, bit 3 = the reported limit is within 1 MiB of the one set.
static int limited_child(void) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        long vm_kb = 0;
        FILE *f = fopen("/proc/self/statm", "r");
        long pages = 0;
        if (f) {
            if (fscanf(f, "%ld", &pages) != 1) pages = 0;
            fclose(f);
        }
        vm_kb = pages * (sysconf(_SC_PAGESIZE) / 1024);
        struct rlimit rl = {.rlim_cur = (rlim_t)(vm_kb + 512 * 1024) * 1024, .rlim_max = RLIM_INFINITY};
        if (pages == 0 || setrlimit(RLIMIT_AS, &rl)) _exit(64);
        long limit = 0;
        int bits = sl_address_space_fits(256, &limit);
        bits |= sl_address_space_fits(4096, &limit) << 1;
        bits |= sl_address_space_fits(256, &limit) << 2;
        long want = (long)(rl.rlim_cur >> 20);
        bits |= (limit >= want - 1 && limit <= want + 1) << 3;
        _exit(bits);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status);
}

TEST(under_a_limit_only_what_fits_fits_and_nothing_stays_mapped) {
    int bits = limited_child();
    CHECK_MSG(bits >= 0 && bits != 64, "child failed (%d)", bits);
    CHECK_MSG(bits & 1, "256 MiB within a limit 512 MiB above the current size did not fit (bits %d)", bits);
    CHECK_MSG(!(bits & 2), "4 GiB fit under that limit (bits %d)", bits);
    CHECK_MSG(bits & 4, "the second 256 MiB trial did not fit: the first left its mapping (bits %d)", bits);
    CHECK_MSG(bits & 8, "the limit reported is not the one set (bits %d)", bits);
}

TEST_MAIN()
