// address_space.h: room under an address-space limit (RLIMIT_AS: `ulimit -v`, or a batch system's)
// for OpenBLAS's GEMM buffers. OpenBLAS maps a buffer of about 128 MiB for each thread that runs a
// GEMM, and one for the calling thread, and when mmap fails it retries forever: under a limit that
// leaves no room, a process hangs. Checked before the libraries start (src/cli/preinit.c) and when a
// command sets its thread count (sl_ops_cpu_set_threads). Only system calls: callable before libc's
// initialisation.
#ifndef SHARDLM_ADDRESS_SPACE_H
#define SHARDLM_ADDRESS_SPACE_H

#define SL_OPENBLAS_BUFFER_MIB 130  // one buffer (128 MiB on x86-64) and its alignment slack
#define SL_ADDRESS_HEADROOM_MIB 64  // thread stacks and libraries loaded later

// The address space OpenBLAS's buffers take with `threads` threads, plus the headroom, in MiB.
long sl_openblas_need_mib(long threads);

// Whether `mib` MiB of address space can be mapped now (tried: mapped without access, unmapped).
// Always 1 without a limit. *limit_mib: the limit in MiB, or -1 when there is none.
int sl_address_space_fits(long mib, long *limit_mib);

#endif
