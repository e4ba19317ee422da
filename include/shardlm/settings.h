// settings.h: the run-time switches shardlm reads from the environment, in one place. They are read
// once (sl_settings_load, or the first sl_settings_get) into one struct that the library consults,
// `shardlm report` prints (with where each value came from), and docs/cli.md ("Environment")
// documents. A malformed value is an error naming the variable, never a silent default.
#ifndef SHARDLM_SETTINGS_H
#define SHARDLM_SETTINGS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// SHARDLM_GEMM's values (sl_settings.cpu_gemm).
enum { SL_GEMM_AUTO, SL_GEMM_OPENBLAS, SL_GEMM_ONEDNN };
// SHARDLM_ATTENTION's values (sl_settings.attention): simt (the GPU's CUDA-core kernels; on the CPU the
// staged fp32 attention), tc (the GPU's WMMA tensor-core kernels of attention_tc.cu; oneDNN on the CPU),
// mma (the GPU's mma.sync kernels of attention_mma.cu; on the CPU as tc), cudnn (the GPU's bf16
// attention through cuDNN's fused flash attention, attention_cudnn.cu, loaded at run time; a call it
// does not take goes to the mma.sync kernels; on the CPU as tc), auto (the default: cudnn while a
// training engine is alive, for the shapes a GPU run has checked it on, where libcudnn loads and builds
// the call's plan, else mma; generation stays on mma, since cuDNN compiles a plan for every new prompt
// length; on the CPU as tc): attention_choice.h's sl_attention_kind() resolves it.
enum { SL_ATTENTION_SIMT, SL_ATTENTION_TC, SL_ATTENTION_MMA, SL_ATTENTION_CUDNN, SL_ATTENTION_AUTO };
// SHARDLM_ATTENTION_GRID's values (sl_settings.attention_grid): the order in which the mma.sync attention
// kernels hand out their (head, tile) blocks. tiles (the default): every head's longest tile first, then
// every head's next; heads: chunks of heads one after another (src/ops/cuda/attention_grid.h), so the
// blocks running at once share their K/V (dK/dV: Q/dO) tiles through L2. Each block computes the same
// either way: the same bits.
enum { SL_ATTENTION_GRID_TILES, SL_ATTENTION_GRID_HEADS };
// SHARDLM_ATTENTION_DQ's values (sl_settings.attention_dq): how the mma.sync attention backward gets dQ.
// split (the default): a kernel of its own, which recomputes S and dP per (query tile, key tile) and
// sums each dQ row in one fixed order, so the bits are the same run to run. atomic (head dims up to 64;
// others keep split): dK / dV's kernel adds each key tile's share dS K into an fp32 buffer with
// atomics, two products a tile pair fewer, but the shares land in whatever order the blocks run, so
// dQ's last bits can differ from run to run.
enum { SL_ATTENTION_DQ_SPLIT, SL_ATTENTION_DQ_ATOMIC, SL_ATTENTION_DQ_ORDERED };

typedef struct {
    int tf32;                  // SHARDLM_TF32=1: fp32 GEMMs on the GPU may use TF32 tensor cores (default 0)
    int gelu_epilogue;         // SHARDLM_GELU_EPILOGUE=0: GPT-2's GELU outside the cuBLASLt epilogue (default 1)
    int bias_grad_epilogue;    // SHARDLM_BIAS_GRAD_EPILOGUE=0: GPU bias gradients by a column-sum kernel, not BGRADB (default 1)
    int attention;             // SHARDLM_ATTENTION=tc|simt|mma|cudnn|auto: the bf16 attention (SL_ATTENTION_*; default auto)
    int attention_grid;        // SHARDLM_ATTENTION_GRID=tiles|heads: the mma.sync attention's block order (default tiles)
    int attention_dq;          // SHARDLM_ATTENTION_DQ=split|atomic|ordered: its backward's dQ (SL_ATTENTION_DQ_*; default split)
    int cudnn_workspace_mb;    // SHARDLM_CUDNN_WORKSPACE_MB: the most cuDNN's attention workspace may take (MiB; default 512)
    int ce_row_smem;           // SHARDLM_CE_ROW_SMEM: rows the GPU's fused classifier holds in shared memory (0-2; default 1)
    int fused_kernels;         // SHARDLM_FUSED_KERNELS=0: the GPU's norms and loss as the earlier kernels (default 1)
    int gemm_autotune;         // SHARDLM_GEMM_AUTOTUNE=1: time cuBLASLt's candidate algorithms once per GEMM shape (default 0)
    int bf16_storage;          // SHARDLM_BF16_STORAGE=0: bf16 runs (GPU and CPU) keep fp32 activations (default 1)
    int emulate_bf16_storage;  // SHARDLM_EMULATE_BF16_STORAGE=1: the CPU emulates bf16 storage (tests; default 0)
    int cpu_bf16;              // SHARDLM_CPU_BF16=0: bf16 on the CPU as if it had no bf16 instructions (default 1)
    int cpu_gemm;              // SHARDLM_GEMM=auto|openblas|onednn: the CPU's fp32 GEMM library (sl_cpu_gemm_choice)
    int log_level;             // SHARDLM_LOG_LEVEL=debug|info|warn|error (sl_log_level; default info)
    char fault[64];            // SHARDLM_FAULT=RANK:STEP:WHERE: fault injection for tests (default none)
    int restart_count;         // SHARDLM_RESTART_COUNT: set by `shardlm launch` on restarts (default 0)
    char cuda_home[1024];      // CUDA_HOME: where CUDA libraries are looked for after the build's (default none)
    char cudnn_library[1024];  // SHARDLM_CUDNN_LIBRARY: the libcudnn.so.9 file to load (default none: the CUDA search)
    // set by `shardlm launch` for its ranks:
    char heartbeat_file[1024]; // SHARDLM_HEARTBEAT_FILE: the rank's heartbeat (default none: no heartbeat)
    int heartbeat_interval_ms; // SHARDLM_HEARTBEAT_INTERVAL_MS: 10 .. 60000 (default 1000)
    int terminal;              // SHARDLM_TERMINAL=0: the output does not end on a terminal (default 1)
} sl_settings;

// (Re)reads every variable; -1 with a message naming the first malformed one (a malformed variable
// keeps its default, the others are read). `shardlm` calls it once at start; tests after setenv.
int sl_settings_load(void);
// SHARDLM_ATTENTION's word for an SL_ATTENTION_* value ("mma", "tc", "simt", "cudnn", "auto"; "?" for another).
const char *sl_attention_name(int attention);
// SHARDLM_ATTENTION_GRID's word for an SL_ATTENTION_GRID_* value ("tiles", "heads"; "?" for another).
const char *sl_attention_grid_name(int grid);
// SHARDLM_ATTENTION_DQ's word for an SL_ATTENTION_DQ_* value ("split", "atomic", "ordered"; "?" for another).
const char *sl_attention_dq_name(int dq);

// The settings (loaded on first use; a malformed variable then leaves its default and is reported by
// sl_settings_load / shardlm report).
const sl_settings *sl_settings_get(void);

// For `shardlm report`: row i (0 .. n-1) as its variable, its value as set (NULL: unset) and a line
// saying what it does; returns 0, or -1 past the last row.
int sl_settings_row(int i, const char **name, const char **value, const char **meaning);

#ifdef __cplusplus
}
#endif

#endif
