// preinit.c: one check that must run before the shared libraries' constructors. OpenBLAS's
// constructor maps its GEMM buffers (address_space.h: about 130 MiB a thread) and, when mmap fails,
// retries forever: under an address-space limit (`ulimit -v`, or a batch system that sets RLIMIT_AS)
// too small for them, shardlm hung before main(). The executable's .preinit_array runs before any
// library's initialiser, so here, when RLIMIT_AS is finite, the buffers' address space and some
// headroom are tried (below ~50 MiB of headroom the process got past OpenBLAS and then aborted in glibc
// for want of memory to load libgcc_s); if they are not there, a message names the limit and the need
// and the process exits with status 1. The threads are OpenBLAS's (and the GEMMs' OpenMP threads):
// OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS or OMP_NUM_THREADS, else the CPUs of the affinity mask; a
// command's --threads is checked again when it is set (sl_ops_cpu_set_threads). Only system calls and
// no stdio: libc may not be initialised yet.
#include "shardlm/address_space.h"

#include <sched.h>
#include <string.h>
#include <unistd.h>

#define OPENBLAS_MAX_THREADS 64  // Debian's build (MAX_THREADS=64 in `shardlm report`'s OpenBLAS config)

static long env_threads(char **envp, const char *name) {
    size_t n = strlen(name);
    for (char **e = envp; e && *e; e++)
        if (!strncmp(*e, name, n) && (*e)[n] == '=') {
            long v = 0;
            for (const char *c = *e + n + 1; *c >= '0' && *c <= '9' && v < OPENBLAS_MAX_THREADS; c++)
                v = 10 * v + (*c - '0');
            return v > 0 ? v : -1;
        }
    return -1;
}

static void put(const char *s) {
    ssize_t r = write(2, s, strlen(s));
    (void)r;
}

static void put_long(long v) {
    char buf[24], *p = buf + sizeof buf - 1;
    *p = '\0';
    do *--p = (char)('0' + v % 10); while ((v /= 10) > 0);
    put(p);
}

static void check_address_space(int argc, char **argv, char **envp) {
    (void)argc;
    (void)argv;
    long threads = env_threads(envp, "OPENBLAS_NUM_THREADS");
    if (threads < 0) threads = env_threads(envp, "GOTO_NUM_THREADS");
    if (threads < 0) threads = env_threads(envp, "OMP_NUM_THREADS");
    if (threads < 0) {
        cpu_set_t mask;
        threads = sysconf(_SC_NPROCESSORS_ONLN);
        if (!sched_getaffinity(0, sizeof mask, &mask) && CPU_COUNT(&mask) > 0) threads = CPU_COUNT(&mask);
    }
    if (threads < 1) threads = 1;
    if (threads > OPENBLAS_MAX_THREADS) threads = OPENBLAS_MAX_THREADS;
    long limit, need = sl_openblas_need_mib(threads);
    if (sl_address_space_fits(need, &limit)) return;
    put("error: the address-space limit (ulimit -v / RLIMIT_AS: ");
    put_long(limit);
    put(" MiB) leaves no room for OpenBLAS's GEMM buffers, which it maps before shardlm starts: ");
    put_long(threads + 1);
    put(" buffers (threads + 1) x ");
    put_long(SL_OPENBLAS_BUFFER_MIB);
    put(" MiB, and ");
    put_long(SL_ADDRESS_HEADROOM_MIB);
    put(" MiB to start, of address space (not of memory: untouched pages cost nothing) on top of the program's "
        "own mappings. Raise the limit (`ulimit -v unlimited`; for training, the model's memory comes on top), or set "
        "OMP_NUM_THREADS lower.\n");
    _exit(1);
}

__attribute__((section(".preinit_array"), used)) static void (*const preinit_check)(int, char **, char **) =
    check_address_space;
