// ops.h: the ops table. Model code calls ops->matmul_forward(...) and never knows the backend.
// The ops over activations are listed once, in ops_list.h (signature, storage-typed arguments,
// what the profiler counts); this table adds memory and the optimizer step's passes. Each op has
// a forward/backward pair with the same argument order (llm.c style); N = B*T rows. Gradients:
//   * parameter gradients (dweight, dbias, dwte, ...) ACCUMULATE (+=), so micro-batches add up;
//   * layernorm/rmsnorm backward ACCUMULATE into dinp (it is the residual stream's gradient);
//   * every other dinp / dqkv output is OVERWRITTEN (=).
// Attention reads q, k, v straight out of the fused qkv activation (N, (NH + 2*NKV) * HD):
// query head h at column h*HD, key head g at NH*HD + g*HD, value head g at (NH+NKV)*HD + g*HD;
// query head h uses key/value head h / (NH/NKV) (grouped-query attention).
//
// Activation storage: sl_act. An `sl_act *` points to activation storage whose element type the
// table says: float32 with act_bf16 = 0, bf16 (sl_bf16 bits, 2 bytes, round to nearest even on
// write) with act_bf16 = 1; ops compute in fp32 inside. sl_act is never defined, so storage cannot
// be read or indexed as float by mistake: a backend converts it to its element type (cpu: sl_f32,
// cuda: as_storage<floatX>), and pointer arithmetic on it goes through the element size
// (sl_act_at). Storage-typed arguments (ops_list.h lists each op's, with element counts):
//   * activations: inp / out / dinp / dout, qkv / dqkv, attention's out, the KV cache, logits and
//     the dlogits written over them, matmul_gelu's pre, a fused norm's resid;
//   * the parameters the ops read (matmul weight and bias, norm w and b, wte / wpe): with act_bf16
//     the model hands them a bf16 SHADOW of its parameters (sl_model.weights_bf16, refreshed by
//     to_storage after every change), because cuBLASLt wants A and B of one type and a bias
//     epilogue's vector of D's type (torch's autocast likewise casts a linear's bias); the engine
//     may then keep the only fp32 copy as master weights.
// Always float32 (float *), whatever act_bf16 says:
//   * parameter gradients (dweight, dbias, dw, db, dwte, dwpe), which still ACCUMULATE in fp32;
//   * the saved statistics: norms' mean / rstd, attention's lse, cross-entropy's lse (and the
//     double it returns); the RoPE cos / sin tables;
//   * every buffer of the optimizer passes (sumsq .. sgd_step), to_storage's src.
#ifndef SHARDLM_OPS_H
#define SHARDLM_OPS_H

#include <stddef.h>
#include <stdint.h>

// Activation storage: an incomplete type (see the top of this file).
typedef struct sl_act sl_act;

// The byte address of element i of storage whose elements are `elem` bytes (2 for bf16, 4 for fp32).
static inline sl_act *sl_act_at(const sl_act *p, size_t i, size_t elem) {
    return (sl_act *)((const char *)p + i * elem);
}

// Dropout's mask (dropout_forward / dropout_backward): element i is kept when a uniform draw in [0, 1)
// that is a pure function of (seed, i) (SplitMix64's finaliser, 24 bits) is >= p. Host and device code
// compute it alike, so every backend drops the same elements.
#ifdef __CUDACC__
#define SL_HOST_DEVICE __host__ __device__
#else
#define SL_HOST_DEVICE
#endif
static inline SL_HOST_DEVICE int sl_dropout_keep(uint64_t seed, size_t i, float p) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ULL * ((uint64_t)i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f) >= p;
}

#include "shardlm/ops_list.h"

// The optimizer step's elementwise arithmetic, its scalars computed once per step in double as
// torch does (optim.c fills these; the CPU and CUDA passes apply them identically).
typedef struct {
    float decay_factor;  // AdamW: p *= decay_factor on decaying elements (1 - lr*wd)
    float l2;            // Adam: g += l2 * p on decaying elements (wd)
    float w1;            // 1 - beta1 (exp_avg.lerp_(g, w1))
    int lerp_low;        // torch's lerp branch: w1 < 0.5 ? m + w1*(g-m) : g - (1-w1)*(g-m)
    float beta2, one_minus_beta2;
    float bc2_sqrt;      // sqrt(1 - beta2^step)
    float eps;
    float neg_step;      // -(lr / (1 - beta1^step))
    float grad_coef;     // each gradient times this before use (gradient clipping's coefficient: what a
                         // scale pass over the gradients would leave in them, bit for bit); 1: none
                         // (sl_adam_args_make sets 1: a hand-made sl_adam_args must set it too)
    void *storage_bf16;  // not NULL: every updated parameter p[i] also rounded to bf16 into element i here
                         // (the model's bf16 weight copy): what a to_storage pass after the step writes
} sl_adam_args;

typedef struct {
    float wd;                   // on decaying elements: g += wd * p
    float momentum, one_minus_dampening, neg_lr;
    int first;                  // step 1: the momentum buffer is set to g
    int nesterov, has_buf;      // has_buf: momentum != 0
} sl_sgd_args;

// A run [begin, end) of a flat buffer (offsets relative to the pointers passed) and whether its
// elements receive weight decay. A step's segments are sorted, disjoint and cover its range.
typedef struct {
    size_t begin, end;
    int decay;
} sl_segment;

// 8-bit AdamW (bitsandbytes' AdamW8bit, its CPU kernels' arithmetic): exp_avg and exp_avg_sq of each
// tensor of at least min_8bit_size elements are stored as one byte per element, in blocks of
// SL_ADAM8_BLOCK elements counted from the tensor's first element, each block with its own float
// absmax: the value is map[byte] * absmax with bitsandbytes' signed dynamic map (sl_dynamic_map(1))
// for exp_avg and the unsigned one for exp_avg_sq. Smaller tensors keep float32 state (bitsandbytes'
// 32-bit path, whose arithmetic differs slightly). optim_8bit.h builds the segments and scalars.
#define SL_ADAM8_BLOCK 256

typedef struct {
    float beta1, one_minus_beta1, beta2, one_minus_beta2;
    float bc2_sqrt, eps, neg_step;   // 8-bit state: denom = sqrt(v) / bc2_sqrt + eps; p += neg_step * (m / denom)
    float eps32, neg_step32;         // 32-bit state: p += neg_step32 * (m / (sqrt(v) + eps32))
    float decay_factor;              // on decaying segments: p *= 1 - lr*wd (1 when wd is 0)
} sl_adam8_args;

// One tensor's part of a step's range. begin/end are relative to the step's p and g pointers.
typedef struct {
    size_t begin, end;
    int decay;
    int quantized;      // 1: 8-bit blockwise state; 0: float32 state (a tensor below min_8bit_size)
    size_t state;       // its first element's index in q1/q2 (quantized) or m32/v32
    size_t block;       // quantized: the absmax slot of the block holding `begin`
    int phase;          // quantized: `begin`'s position inside that block (> 0 only when a shard cuts it)
    // quantized: the first / last block goes on past this range (a ZeRO shard boundary cuts it); it is
    // requantised with the absmax of the whole block, which the caller supplies (sl_adam8_edges)
    int cut_head, cut_tail;
} sl_adam8_segment;

typedef struct {
    unsigned char *q1, *q2;   // the 8-bit exp_avg / exp_avg_sq codes
    float *absmax1, *absmax2; // one per block
    float *m32, *v32;         // exp_avg / exp_avg_sq of the float32-state tensors
} sl_adam8_state;

// The absmax of a step's cut blocks (at most one at each end of its range): measured over this
// range's part, or (to apply) over the whole block.
typedef struct {
    float head[2], tail[2];   // {exp_avg, exp_avg_sq}
} sl_adam8_edges;

// bitsandbytes' create_dynamic_map(signed) (max_exponent_bits 7, 8 bits): 256 sorted floats, computed
// with the same float32 operations, so equal to its map bit for bit.
void sl_dynamic_map(int is_signed, float map[256]);

typedef struct sl_ops {
    const char *name;

    // The ops over activations, one field each, in the order of ops_list.h (their shapes and rules).
#define SL_OP_FIELD(ret, name, params, args, storage, flops, emulation) ret(*name) params;
    SL_OPS(SL_OP_FIELD)
#undef SL_OP_FIELD

    // The training precision (sl_precision) whose rounded values the ops are handed; later GEMMs may
    // compute at it. cuda: bf16 -> CUBLAS_COMPUTE_32F_FAST_16BF, fp16 -> CUBLAS_COMPUTE_32F_FAST_16F
    // (tensor-core GEMMs on the fp32 buffers, fp32 accumulation), fp32 -> CUBLAS_COMPUTE_32F
    // (CUBLAS_COMPUTE_32F_FAST_TF32 with SHARDLM_TF32=1); cpu: nothing (fp32 tables compute in fp32, the
    // bf16-storage ones in bf16 whatever it says).
    // sl_model_forward / sl_model_backward call it with sl_model.precision; it lasts until the next call.
    void (*set_precision)(int precision);

    // ---- memory: where this backend's tensors live -------------------------------------------
    int on_device;                                   // 0: host memory (cpu); 1: GPU memory (cuda)
    // 1: activations (and the GEMMs' weight and bias arguments) are bf16 storage, see the top of this file;
    // 0: everything is fp32. cpu and cuda: 0; cpu-bf16 (ops_cpu_bf16.c, a test backend), cpu-bf16-onednn
    // and cuda-bf16: 1.
    int act_bf16;
    // 1: attention_forward / attention_backward honour a sliding window shorter than T (cpu, cpu-bf16);
    // 0: the model refuses such a window rather than hand it over (cuda, for now).
    int sliding_window;
    void *(*alloc)(size_t bytes, const char *what);  // zero-filled; NULL with a message naming `what`
    void (*dealloc)(void *p);
    void (*memzero)(void *p, size_t bytes);
    void (*upload)(void *dst, const void *host_src, size_t bytes);    // host -> backend
    void (*download)(void *host_dst, const void *src, size_t bytes);  // backend -> host (waits)
    void (*copy)(void *dst, const void *src, size_t bytes);           // backend -> backend
    int (*synchronize)(void);                        // waits; -1 with the error when queued work failed
    // The queue this backend's work goes to (a cudaStream_t for cuda), so a communication library
    // can order its own queue after it; NULL for cpu, whose ops have finished when they return.
    void *(*stream)(void);
    // High-water mark of bytes held through alloc since start (or the last reset); 0 for cpu, whose
    // buffers are ordinary heap memory. reset sets the mark to what is held now.
    size_t (*peak_bytes)(void);
    void (*reset_peak_bytes)(void);

    // ---- the optimizer step's passes over flat fp32 buffers ------------------------------------
    // Sum of squares in double, deterministic for a given n (a fixed reduction tree).
    double (*sumsq)(const float *g, size_t n);
    void (*scale)(float *x, size_t n, float coef);   // x *= coef
    void (*add)(float *x, const float *y, size_t n);  // x += y (fp32, whatever act_bf16 says)
    int (*nonfinite)(const float *x, size_t n);       // 1 when any element is Inf or NaN
    // x[i] = x rounded to bf16 / fp16 storage (sl_precision; fp32: nothing), as precision.h rounds.
    void (*round_to)(float *x, size_t n, int precision);
    // dst (n bf16 storage elements, 2 bytes each) = src (n fp32) rounded to nearest even, exactly as
    // sl_f32_to_bf16; fills the bf16 weight shadow of an act_bf16 backend.
    void (*to_storage)(void *dst, const float *src, size_t n);
    // One launch over every segment (segs: a host array): the multi-tensor AdamW / Adam and SGD
    // of optim.h, bit-identical across backends.
    void (*adam_step)(const sl_adam_args *a, float *p, const float *g, float *m, float *v, const sl_segment *segs,
                      int n_segs);
    void (*sgd_step)(const sl_sgd_args *a, float *p, const float *g, float *buf, const sl_segment *segs, int n_segs);
    // 8-bit AdamW over every segment (NULL where the backend has none: cuda for now). measure = 1 only
    // computes the cut blocks' new state and writes its absmax over this range into *edges, changing
    // nothing; measure = 0 is the step, requantising cut blocks with the absmax in *edges.
    void (*adam8_step)(const sl_adam8_args *a, float *p, const float *g, const sl_adam8_state *st,
                       const sl_adam8_segment *segs, int n_segs, sl_adam8_edges *edges, int measure);
} sl_ops;

extern const sl_ops sl_ops_cpu;
// A test backend emulating the GPU's bf16 activation storage on the CPU (act_bf16 = 1): each op
// widens its storage-typed inputs to fp32, runs sl_ops_cpu's op and rounds its storage-typed outputs
// back to bf16. Slow; `--device cpu` picks it when SHARDLM_EMULATE_BF16_STORAGE=1, and bf16 runs on a
// CPU without bf16 instructions fall back to it. The oracle of sl_ops_cpu_bf16_native's tests.
extern const sl_ops sl_ops_cpu_bf16;
// bf16 activation storage on the CPU for real ("cpu-bf16-onednn", act_bf16 = 1): the GEMMs read the
// bf16 operands through oneDNN's matmul (bf16 instructions, fp32 accumulation); the other ops are the
// emulation's, staged through reusable fp32 scratch. `--precision bf16 --device cpu` trains with it
// where sl_ops_cpu_bf16_native_usable says so (sl_ops_for_precision).
extern const sl_ops sl_ops_cpu_bf16_native;
// 1 when sl_ops_cpu_bf16_native runs on bf16 instructions here: the CPU (and OS) has avx512_bf16 or
// amx_bf16, oneDNN has a bf16 matmul kernel for it (not its reference code) and SHARDLM_CPU_BF16 is
// not 0; why (cap bytes) gets the kernel, or the reason when 0.
int sl_ops_cpu_bf16_native_usable(char *why, size_t cap);

// The ops table for `--device cpu|cuda` ("cuda:N" picks GPU N; "cuda" the one LOCAL_RANK says, as
// torchrun does; "cpu" is sl_ops_cpu_bf16 when SHARDLM_EMULATE_BF16_STORAGE=1). Initialises the device. NULL with a message when the name is unknown, the binary
// was built without CUDA, or no usable GPU is there.
const sl_ops *sl_ops_for_device(const char *device, int local_rank);
// The table a run at `precision` (sl_precision) uses on the device of `ops` (sl_ops_for_device's
// answer): bf16 stores activations in bf16 unless SHARDLM_BF16_STORAGE=0 is set: on the GPU
// sl_ops_cuda_bf16 (act_bf16 = 1: half the activation memory, bf16 tensor-core GEMMs reading bf16
// operands, as torch's autocast); on the CPU (ops == &sl_ops_cpu) sl_ops_cpu_bf16_native where
// sl_ops_cpu_bf16_native_usable, else the emulation sl_ops_cpu_bf16 with a one-line notice (once per
// process) saying why. Every other case (fp32, fp16, the emulation asked for) returns ops unchanged.
const sl_ops *sl_ops_for_precision(const sl_ops *ops, int precision);
// 1 when this binary has the CUDA backend compiled in.
int sl_ops_cuda_built(void);

// Thread count for the CPU backend (OpenMP and OpenBLAS); <= 0 keeps OMP_NUM_THREADS / the default.
// -1 (error set, nothing changed) when an address-space limit leaves no room for OpenBLAS's GEMM
// buffers at n threads, where OpenBLAS would retry forever (address_space.h); else 0.
int sl_ops_cpu_set_threads(int n);
int sl_ops_cpu_threads(void);

#endif
