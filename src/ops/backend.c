// backend.c: `--device cpu | cuda | cuda:N` -> the ops table (sl_ops_for_device), its bf16-storage
// twin for bf16 runs (sl_ops_for_precision: cuda-bf16 on the GPU; cpu-bf16-onednn on a CPU with bf16
// instructions, else the emulation), and whether this binary has the CUDA backend
// (sl_ops_cuda_built). SHARDLM_EMULATE_BF16_STORAGE=1 turns `cpu` into
// cpu-bf16, the test backend emulating bf16 activation storage. Plain C with no CUDA header: the CUDA backend
// is reached through cuda_ops.h's C declarations, and only when the Makefile defines
// SHARDLM_HAVE_CUDA (nvcc found at build time, CUDA != 0).
//
// Device numbering: "cuda:N" is GPU N; "cuda" is GPU (local_rank mod the number of visible GPUs),
// the torchrun convention (LOCAL_RANK r drives GPU r). GPUs are numbered within the set that
// CUDA_VISIBLE_DEVICES exposes, so a launcher that hands each rank one GPU through
// CUDA_VISIBLE_DEVICES gets GPU 0 in every rank, as intended.
#include "shardlm/settings.h"
#include "shardlm/error.h"
#include "shardlm/log.h"
#include "shardlm/ops.h"
#include "shardlm/precision.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#ifdef SHARDLM_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"        // C declarations only (cuda_backend_init)
extern const sl_ops sl_ops_cuda;       // ops_cuda.cu
extern const sl_ops sl_ops_cuda_bf16;  // ops_cuda.cu: the same with bf16 activation storage
#endif

int sl_ops_cuda_built(void) {
#ifdef SHARDLM_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

// "cuda:N" -> N (>= 0); -1 when what follows "cuda:" is not a plain decimal number.
static int parse_gpu_index(const char *s) {
    if (!*s || *s == '-' || *s == '+' || *s == ' ') return -1;
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < 0 || v > 1000000) return -1;
    return (int)v;
}

const sl_ops *sl_ops_for_device(const char *device, int local_rank) {
    if (!device || !strcmp(device, "cpu")) {
        // the test backend emulating the GPU's bf16 activation storage (ops.h: sl_ops_cpu_bf16)
        return sl_settings_get()->emulate_bf16_storage ? &sl_ops_cpu_bf16 : &sl_ops_cpu;
    }
    int is_cuda = !strcmp(device, "cuda"), is_indexed = !strncmp(device, "cuda:", 5);
    if (!is_cuda && !is_indexed) {
        sl_errorf("--device '%s' is not a device: expected cpu, cuda or cuda:N (N = GPU index)", device);
        return NULL;
    }
    int gpu = 0;
    if (is_indexed && (gpu = parse_gpu_index(device + 5)) < 0) {
        sl_errorf("--device '%s': expected cuda:N with N a GPU index (0, 1, ...)", device);
        return NULL;
    }
#ifdef SHARDLM_HAVE_CUDA
    if (is_cuda) {
        int count = cuda_device_count();
        if (count < 0) {
            sl_error_context("--device %s", device);
            return NULL;
        }
        gpu = (local_rank > 0 ? local_rank : 0) % count;
    }
    if (cuda_backend_init(gpu)) {
        if (is_cuda) sl_error_context("--device cuda (local rank %d -> GPU %d)", local_rank, gpu);
        else sl_error_context("--device %s", device);
        return NULL;
    }
    return &sl_ops_cuda;
#else
    (void)local_rank;
    (void)gpu;
    sl_errorf("--device %s: this binary was built without the CUDA backend (nvcc was not found at build time, "
              "or it was built with CUDA=0; see docs)", device);
    return NULL;
#endif
}

// bf16 storage on the CPU: the oneDNN table where this CPU has bf16 instructions, else the emulation
// (same storage, same results as SHARDLM_EMULATE_BF16_STORAGE=1, slower) with a notice, once.
static const sl_ops *cpu_bf16_table(void) {
    static int noticed;
    char why[256];
    if (sl_ops_cpu_bf16_native_usable(why, sizeof why)) return &sl_ops_cpu_bf16_native;
    if (!noticed++)
        sl_log(SL_LOG_WARN, "--precision bf16 on the CPU: %s; running the bf16-storage emulation instead "
               "(cpu-bf16: same storage, slower; SHARDLM_BF16_STORAGE=0 keeps fp32 activations)", why);
    return &sl_ops_cpu_bf16;
}

const sl_ops *sl_ops_for_precision(const sl_ops *ops, int precision) {
    if (precision != SL_PRECISION_BF16 || !sl_settings_get()->bf16_storage) return ops;
    if (ops == &sl_ops_cpu) return cpu_bf16_table();
#ifdef SHARDLM_HAVE_CUDA
    if (ops == &sl_ops_cuda) return &sl_ops_cuda_bf16;
#endif
    return ops;
}
