// address_space.c: see address_space.h.
#include "shardlm/address_space.h"

#include <stddef.h>
#include <sys/mman.h>
#include <sys/resource.h>

long sl_openblas_need_mib(long threads) {
    return (threads + 1) * SL_OPENBLAS_BUFFER_MIB + SL_ADDRESS_HEADROOM_MIB;
}

int sl_address_space_fits(long mib, long *limit_mib) {
    struct rlimit rl;
    *limit_mib = -1;
    if (getrlimit(RLIMIT_AS, &rl) || rl.rlim_cur == RLIM_INFINITY) return 1;
    *limit_mib = (long)(rl.rlim_cur >> 20);
    size_t bytes = (size_t)mib << 20;
    void *p = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return 0;
    munmap(p, bytes);
    return 1;
}
