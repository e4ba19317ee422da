// settings.c: the environment read once into sl_settings (see settings.h).
#include "shardlm/settings.h"
#include "shardlm/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULTS                                                                                         \
    {.gelu_epilogue = 1, .bias_grad_epilogue = 1, .attention = SL_ATTENTION_AUTO, .ce_row_smem = 1,       \
     .cudnn_workspace_mb = 512, .fused_kernels = 1, .bf16_storage = 1, .cpu_bf16 = 1, .log_level = 1,    \
     .heartbeat_interval_ms = 1000, .terminal = 1}
static sl_settings settings = DEFAULTS;
static int loaded;

static const struct { const char *name, *meaning; } variables[] = {
    {"SHARDLM_TF32", "1: fp32 GEMMs on the GPU may use TF32 tensor cores (default 0: exact fp32)"},
    {"SHARDLM_GELU_EPILOGUE", "0: GPT-2's GELU as its own kernel instead of cuBLASLt's epilogue (default 1)"},
    {"SHARDLM_BIAS_GRAD_EPILOGUE", "0: a linear layer's bias gradient on the GPU as a column-sum kernel after the GEMMs instead of cuBLASLt's BGRADB epilogue on the dweight GEMM (default 1; H200 2026-11-28: the same step time within the run's spread)"},
    {"SHARDLM_ATTENTION", "auto (default): on the GPU cuDNN's fused flash attention in training for the shapes checked on a GPU so far (head dim 64 without GQA, T a multiple of 128; H200 2026-11-28: GPT-2 124M B=64 attention 33.8 -> 23.2 ms a step), the mma.sync kernels elsewhere and wherever cuDNN is missing or refuses a call; mma: the mma.sync tensor-core kernels with fragments in registers; cudnn: cuDNN's fused flash attention, loaded at run time, in generation too (calls it does not take go to mma; a missing libcudnn is an error); tc: the WMMA tensor-core kernels; simt: the CUDA-core kernels; on the CPU simt is the staged fp32 attention, the others oneDNN bf16 matmuls"},
    {"SHARDLM_CUDNN_WORKSPACE_MB", "the most workspace (MiB, 1 .. 1048576; default 512) one cuDNN attention call may take: a batch whose workspace would pass it runs in slices of sequences, one call each (the deterministic backward needs 2 bytes a score: 24 MiB a GPT-2 sequence at T 1024)"},
    {"SHARDLM_ATTENTION_GRID", "heads: the GPU's mma.sync attention kernels take their blocks in chunks of heads that fit a share of L2 (longest tiles first in each), so the blocks running at once share K and V through L2; tiles (default): every head's longest tile first. The same bits either way (A/B timing; H200 2026-11-27/28: no faster)"},
    {"SHARDLM_ATTENTION_DQ", "atomic: the GPU's mma.sync attention backward adds dQ inside the dK/dV kernel with fp32 atomics (head dims up to 64; two tile products fewer, but dQ is not bit-reproducible run to run; H200: backward 35.8 -> 30.8 ms a GPT-2 124M B=64 step); ordered: the same, each dQ sum taking its key tiles in order, so bit-reproducible (H200 2026-11-28: backward 34.4 ms, slower than split's 25.5); split (default): dQ by a kernel of its own, deterministic"},
    {"SHARDLM_CE_ROW_SMEM", "0: the GPU's fused classifier reads each row of logits twice, once from memory and once from L2 (A/B timing); default 1: it copies each row into shared memory where one fits and reads it from there (the same bits; H200 2026-11-27: 7.66 -> 6.96 ms a GPT-2 124M B=64 step); 2: two rows a block where two fit, the next row's copy in flight while one is used (the same bits; H200 2026-11-28: no faster)"},
    {"SHARDLM_FUSED_KERNELS", "0: the GPU's norm backward, cross-entropy and GELU gradient as the earlier separate kernels (A/B timing; default 1)"},
    {"SHARDLM_GEMM_AUTOTUNE", "1: each GPU GEMM shape times cuBLASLt's candidate algorithms once and keeps the fastest (default 0: the heuristic's first, the same in every run)"},
    {"SHARDLM_BF16_STORAGE", "0: --precision bf16 keeps fp32 activations, on the GPU and the CPU (default 1: bf16 storage)"},
    {"SHARDLM_EMULATE_BF16_STORAGE", "1: the CPU backend emulates the GPU's bf16 storage (tests; default 0)"},
    {"SHARDLM_CPU_BF16", "0: bf16 on the CPU acts as on a CPU without bf16 instructions (emulation; default 1)"},
    {"SHARDLM_GEMM", "openblas or onednn: the CPU's fp32 GEMM library (default auto: oneDNN where the CPU has AVX2, OpenBLAS otherwise)"},
    {"SHARDLM_LOG_LEVEL", "debug, info, warn or error: the lowest level logged (default info)"},
    {"SHARDLM_FAULT", "RANK:STEP:WHERE: that rank kills itself there (fault-injection tests; default none)"},
    {"SHARDLM_RESTART_COUNT", "restarts so far, set by shardlm launch (faults fire only before the first)"},
    {"CUDA_HOME", "also look for CUDA libraries in CUDA_HOME/lib64 (after the build's CUDA_HOME)"},
    {"SHARDLM_CUDNN_LIBRARY", "the libcudnn.so.9 file cuDNN's attention loads, e.g. a newer cuDNN's from the nvidia-cudnn wheel (default: the build's CUDA library folder, CUDA_HOME/lib64, then the loader's path); a file that does not load is an error naming it"},
    {"SHARDLM_HEARTBEAT_FILE", "set by shardlm launch: the file this rank's heartbeat thread rewrites"},
    {"SHARDLM_HEARTBEAT_INTERVAL_MS", "set by shardlm launch: milliseconds between heartbeats (10 .. 60000)"},
    {"SHARDLM_TERMINAL", "set by shardlm launch: 0 when the job's output is not a terminal (plain progress)"},
};

// The first malformed variable of a load ("" when none).
static char first_error[256];

__attribute__((format(printf, 1, 2))) static void malformed(const char *fmt, ...) {
    if (first_error[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(first_error, sizeof first_error, fmt, ap);
    va_end(ap);
}

// One of `n` words: unset keeps *out; word k sets values[k]; anything else is malformed.
static void read_word(const char *name, const char *const *words, const int *values, int n, int *out,
                      const char *expected) {
    const char *v = getenv(name);
    if (!v || !*v) return;
    for (int k = 0; k < n; k++)
        if (!strcmp(v, words[k])) {
            *out = values[k];
            return;
        }
    malformed("%s=\"%s\": expected %s", name, v, expected);
}

static void read_switch(const char *name, int *out) {
    static const char *const words[] = {"0", "1"};
    static const int values[] = {0, 1};
    read_word(name, words, values, 2, out, "0 or 1");
}

static void read_string(const char *name, char *out, size_t cap) {
    const char *v = getenv(name);
    out[0] = '\0';
    if (!v) return;
    if (strlen(v) >= cap) malformed("%s is longer than %zu characters", name, cap - 1);
    else memcpy(out, v, strlen(v) + 1);
}

static void read_int(const char *name, int lo, int hi, int *out) {
    const char *v = getenv(name);
    if (!v || !*v) return;
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || n < lo || n > hi) malformed("%s=\"%s\": expected an integer from %d to %d", name, v, lo, hi);
    else *out = (int)n;
}

// SHARDLM_ATTENTION's words, at their SL_ATTENTION_* values.
static const char *const attention_words[] = {[SL_ATTENTION_SIMT] = "simt", [SL_ATTENTION_TC] = "tc",
                                              [SL_ATTENTION_MMA] = "mma", [SL_ATTENTION_CUDNN] = "cudnn",
                                              [SL_ATTENTION_AUTO] = "auto"};

const char *sl_attention_name(int attention) {
    return attention >= 0 && attention < 5 ? attention_words[attention] : "?";
}

// SHARDLM_ATTENTION_GRID's words, at their SL_ATTENTION_GRID_* values.
static const char *const grid_words[] = {[SL_ATTENTION_GRID_TILES] = "tiles", [SL_ATTENTION_GRID_HEADS] = "heads"};

const char *sl_attention_grid_name(int grid) { return grid >= 0 && grid < 2 ? grid_words[grid] : "?"; }

// SHARDLM_ATTENTION_DQ's words, at their SL_ATTENTION_DQ_* values.
static const char *const dq_words[] = {[SL_ATTENTION_DQ_SPLIT] = "split", [SL_ATTENTION_DQ_ATOMIC] = "atomic",
                                       [SL_ATTENTION_DQ_ORDERED] = "ordered"};

const char *sl_attention_dq_name(int dq) { return dq >= 0 && dq < 3 ? dq_words[dq] : "?"; }

int sl_settings_load(void) {
    static const char *const levels[] = {"debug", "info", "warn", "error"};
    static const int attention_v[] = {SL_ATTENTION_SIMT, SL_ATTENTION_TC, SL_ATTENTION_MMA, SL_ATTENTION_CUDNN,
                                      SL_ATTENTION_AUTO},
                     levels_v[] = {0, 1, 2, 3};
    sl_settings s = DEFAULTS;
    first_error[0] = '\0';
    read_switch("SHARDLM_TF32", &s.tf32);
    read_switch("SHARDLM_GELU_EPILOGUE", &s.gelu_epilogue);
    read_switch("SHARDLM_BIAS_GRAD_EPILOGUE", &s.bias_grad_epilogue);
    read_word("SHARDLM_ATTENTION", attention_words, attention_v, 5, &s.attention, "auto, mma, cudnn, tc or simt");
    static const int grid_v[] = {SL_ATTENTION_GRID_TILES, SL_ATTENTION_GRID_HEADS};
    read_word("SHARDLM_ATTENTION_GRID", grid_words, grid_v, 2, &s.attention_grid, "tiles or heads");
    static const int dq_v[] = {SL_ATTENTION_DQ_SPLIT, SL_ATTENTION_DQ_ATOMIC, SL_ATTENTION_DQ_ORDERED};
    read_word("SHARDLM_ATTENTION_DQ", dq_words, dq_v, 3, &s.attention_dq, "split, atomic or ordered");
    static const char *const ce_rows[] = {"0", "1", "2"};  // rows of logits a block holds in shared memory
    static const int ce_rows_v[] = {0, 1, 2};
    read_word("SHARDLM_CE_ROW_SMEM", ce_rows, ce_rows_v, 3, &s.ce_row_smem, "0, 1 or 2");
    read_int("SHARDLM_CUDNN_WORKSPACE_MB", 1, 1048576, &s.cudnn_workspace_mb);
    read_switch("SHARDLM_FUSED_KERNELS", &s.fused_kernels);
    read_switch("SHARDLM_GEMM_AUTOTUNE", &s.gemm_autotune);
    read_switch("SHARDLM_BF16_STORAGE", &s.bf16_storage);
    read_switch("SHARDLM_EMULATE_BF16_STORAGE", &s.emulate_bf16_storage);
    read_switch("SHARDLM_CPU_BF16", &s.cpu_bf16);
    static const char *const gemm[] = {"auto", "openblas", "onednn"};
    static const int gemm_v[] = {SL_GEMM_AUTO, SL_GEMM_OPENBLAS, SL_GEMM_ONEDNN};
    read_word("SHARDLM_GEMM", gemm, gemm_v, 3, &s.cpu_gemm, "auto, openblas or onednn");
    read_word("SHARDLM_LOG_LEVEL", levels, levels_v, 4, &s.log_level, "debug, info, warn or error");
    read_string("SHARDLM_FAULT", s.fault, sizeof s.fault);
    read_int("SHARDLM_RESTART_COUNT", 0, 1000000, &s.restart_count);
    read_string("CUDA_HOME", s.cuda_home, sizeof s.cuda_home);
    read_string("SHARDLM_CUDNN_LIBRARY", s.cudnn_library, sizeof s.cudnn_library);
    read_string("SHARDLM_HEARTBEAT_FILE", s.heartbeat_file, sizeof s.heartbeat_file);
    read_int("SHARDLM_HEARTBEAT_INTERVAL_MS", 10, 60000, &s.heartbeat_interval_ms);
    read_switch("SHARDLM_TERMINAL", &s.terminal);
    settings = s;
    loaded = 1;
    return first_error[0] ? sl_errorf("%s", first_error) : 0;
}

const sl_settings *sl_settings_get(void) {
    if (!loaded) (void)sl_settings_load();
    return &settings;
}

int sl_settings_row(int i, const char **name, const char **value, const char **meaning) {
    if (i < 0 || i >= (int)(sizeof variables / sizeof variables[0])) return -1;
    *name = variables[i].name;
    *value = getenv(variables[i].name);
    *meaning = variables[i].meaning;
    return 0;
}
