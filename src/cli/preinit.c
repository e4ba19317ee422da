// preinit.c: one check that must run before the shared libraries' constructors. OpenBLAS's
// constructor maps a GEMM buffer of about 128 MiB for each of its threads (OPENBLAS_NUM_THREADS,
// GOTO_NUM_THREADS or OMP_NUM_THREADS, else the CPU count) and one more (seen: 2 threads, 3 buffers
// before the hang), and when mmap fails it retries forever: under
// an address-space limit (`ulimit -v`, or a batch system that sets RLIMIT_AS) too small for them,
// shardlm hung before main(). The executable's .preinit_array runs before any library's initialiser,
// so here, when RLIMIT_AS is finite, the buffers' address space and a little headroom are tried (mapped
// without access, then unmapped; below ~50 MiB of headroom the process got past OpenBLAS and then
// aborted in glibc for want of memory to load libgcc_s); if it is not there, a message names the limit and what it must hold, and the process
// exits with status 1. Only system calls and no stdio: libc may not be initialised yet.
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#define OPENBLAS_BUFFER_MIB 130  // its buffer (128 MiB on x86-64) plus alignment slack, per thread
#define HEADROOM_MIB 64           // thread stacks, libraries loaded later, the start of the command itself
#define MAX_THREADS 1024

static long env_threads(char **envp, const char *name) {
    size_t n = strlen(name);
    for (char **e = envp; e && *e; e++)
        if (!strncmp(*e, name, n) && (*e)[n] == '=') {
            long v = 0;
            for (const char *c = *e + n + 1; *c >= '0' && *c <= '9' && v < MAX_THREADS; c++) v = 10 * v + (*c - '0');
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
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) || rl.rlim_cur == RLIM_INFINITY) return;
    // OpenBLAS's own rule (blas_get_cpu_number): the first of these set, else the CPUs online
    long threads = env_threads(envp, "OPENBLAS_NUM_THREADS");
    if (threads < 0) threads = env_threads(envp, "GOTO_NUM_THREADS");
    if (threads < 0) threads = env_threads(envp, "OMP_NUM_THREADS");
    if (threads < 0) threads = sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    size_t need = ((size_t)(threads + 1) * OPENBLAS_BUFFER_MIB + HEADROOM_MIB) << 20;
    void *p = mmap(NULL, need, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) {
        munmap(p, need);
        return;
    }
    put("error: the address-space limit (ulimit -v / RLIMIT_AS: ");
    put_long((long)(rl.rlim_cur >> 20));
    put(" MiB) leaves no room for OpenBLAS's GEMM buffers, which it maps before shardlm starts: ");
    put_long(threads + 1);
    put(" buffers (threads + 1) x ");
    put_long(OPENBLAS_BUFFER_MIB);
    put(" MiB, and ");
    put_long(HEADROOM_MIB);
    put(" MiB to start, of address space (not of memory: untouched pages cost nothing) on top of the program's "
        "own mappings. Raise the limit (`ulimit -v unlimited`; for training, the model's memory comes on top), or set "
        "OMP_NUM_THREADS lower.\n");
    _exit(1);
}

__attribute__((section(".preinit_array"), used)) static void (*const preinit_check)(int, char **, char **) =
    check_address_space;
