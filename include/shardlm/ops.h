// ops.h: the ops table. Model code calls ops->matmul_forward(...) and never knows the backend.
// Each op has a forward/backward pair with the same argument order (llm.c style). Shapes are in
// the comments; N = B*T rows. Conventions for gradients:
//   * parameter gradients (dweight, dbias, dwte, ...) ACCUMULATE (+=), so micro-batches add up;
//   * layernorm/rmsnorm backward ACCUMULATE into dinp (it is the residual stream's gradient);
//   * every other dinp / dqkv output is OVERWRITTEN (=).
// Attention reads q, k, v straight out of the fused qkv activation (N, (NH + 2*NKV) * HD):
// query head h at column h*HD, key head g at NH*HD + g*HD, value head g at (NH+NKV)*HD + g*HD;
// query head h uses key/value head h / (NH/NKV) (grouped-query attention).
//
// Activation storage (sl_ops.act_bf16). With act_bf16 = 0 every pointer is what its prototype says,
// float32. With act_bf16 = 1 every ACTIVATION pointer an op receives points to bf16 storage (sl_bf16
// bits, 2 bytes an element) although the prototypes say float *; the op reads and writes bf16 there
// (rounding to nearest even) and computes in fp32 inside. Storage-typed (activations):
//   * inp / out / dinp / dout of every op, a / b of the residual adds, the fused norms' resid;
//   * qkv and dqkv, attention's out (and q, k_cache, v_cache, out of attention_decode);
//   * the logits of cross-entropy, and the dlogits its backward writes over them in place;
//   * matmul_gelu's pre (and the dout it overwrites with dpre);
//   * the `weight` and `bias` of matmul_forward / matmul_backward / matmul_gelu_*: with act_bf16
//     the model hands them a bf16 SHADOW copy of its parameters (sl_model.weights_bf16, refreshed by
//     to_storage after every change of the parameters), because cuBLASLt wants A and B of one type
//     and a bias epilogue's vector of D's type (torch's autocast likewise casts a linear's bias);
//   * the parameters the other ops read, for the same reason: the norms' w and b (layernorm,
//     rmsnorm, the fused residual norms, their backward) and the encoder's wte / wpe, so the model
//     reads its parameters only through the bf16 shadow (and an engine may keep the only fp32 copy
//     as its master weights);
//   * a fused residual norm's resid, which its norm reads back as stored (rounded), exactly as the
//     unfused residual_forward followed by the norm's forward would.
// Always fp32, whatever act_bf16 says:
//   * parameter gradients (dweight, dbias, dw, db, dwte, dwpe), which still ACCUMULATE in fp32;
//   * the saved statistics: norms' mean / rstd, attention's lse, cross-entropy's lse (and the
//     double it returns); the RoPE cos / sin tables;
//   * every buffer of the optimizer passes (sumsq .. sgd_step), to_storage's src.
#ifndef SHARDLM_OPS_H
#define SHARDLM_OPS_H

#include <stddef.h>

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

typedef struct sl_ops {
    const char *name;

    // out (B,T,C) = wte[inp] (+ wpe[t]); wpe may be NULL (LLaMA).
    void (*encoder_forward)(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C);
    // dwte[inp] += dout; dwpe[t] += dout (dwpe may be NULL).
    void (*encoder_backward)(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C);

    // out (N,OC) = inp (N,IC) @ weight^T (OC,IC) + bias (OC) (bias may be NULL).
    void (*matmul_forward)(float *out, const float *inp, const float *weight, const float *bias, int N, int IC, int OC);
    // dinp (N,IC) = dout @ weight (skipped if dinp NULL); dweight += dout^T @ inp; dbias += colsum(dout).
    void (*matmul_backward)(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int N, int IC, int OC);
    // The GPT-2 MLP up-projection fused with its tanh GELU: pre (N,OC) = inp (N,IC) @ weight^T + bias
    // (bias may be NULL), out (N,OC) = gelu(pre). pre is saved for backward (cuBLASLt's GELU_AUX_BIAS
    // epilogue writes it as the auxiliary output). Equal to matmul_forward then gelu_forward.
    void (*matmul_gelu_forward)(float *out, float *pre, const float *inp, const float *weight, const float *bias,
                                int N, int IC, int OC);
    // dout (N,OC), the gradient wrt out, is OVERWRITTEN with the gradient wrt pre (dout * gelu'(pre));
    // then exactly matmul_backward with it: dinp = dpre @ weight (skipped if dinp NULL),
    // dweight += dpre^T @ inp, dbias += colsum(dpre). Equal to gelu_backward then matmul_backward.
    void (*matmul_gelu_backward)(float *dinp, float *dweight, float *dbias, float *dout, const float *pre,
                                 const float *inp, const float *weight, int N, int IC, int OC);

    // out (N,C) = (inp - mean) * rstd * w + b; saves mean, rstd (N).
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                              int N, int C, float eps);
    void (*layernorm_backward)(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                               const float *mean, const float *rstd, int N, int C);
    // out (N,C) = inp * rstd * w with rstd = 1/sqrt(mean(inp^2) + eps); saves rstd (N).
    void (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps);
    void (*rmsnorm_backward)(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                             const float *rstd, int N, int C);

    // out = a + b (n)
    void (*residual_forward)(float *out, const float *a, const float *b, size_t n);
    // The residual add fused with the norm that reads it (a block's ln1 / ln2, the final norm), one
    // pass per row: resid (N,C) = a + b, then out = layernorm(resid) saving mean, rstd (N), or
    // out = rmsnorm(resid) saving rstd: the same values as residual_forward followed by the norm's
    // forward. resid may be a or b (in place). No backward of their own: the norms' backward already
    // ACCUMULATES into the residual stream's gradient, which is both a's and b's.
    void (*residual_layernorm_forward)(float *resid, float *out, float *mean, float *rstd, const float *a,
                                       const float *b, const float *w, const float *bias, int N, int C, float eps);
    void (*residual_rmsnorm_forward)(float *resid, float *out, float *rstd, const float *a, const float *b,
                                     const float *w, int N, int C, float eps);

    // tanh-approximate GELU ("gelu_new").
    void (*gelu_forward)(float *out, const float *inp, size_t n);
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, size_t n);
    // out (N,I) = silu(inp[:, :I]) * inp[:, I:]; inp (N, 2I) is the fused gate|up projection.
    void (*swiglu_forward)(float *out, const float *inp, int N, int I);
    void (*swiglu_backward)(float *dinp, const float *inp, const float *dout, int N, int I);

    // Rotary embeddings (rotate-half convention of LlamaForCausalLM), in place on the q and k heads of
    // qkv (B,T,(NH+2NKV)*HD) for positions pos0..pos0+T-1; cos/sin are (max_T, HD/2) tables.
    void (*rope_forward)(float *qkv, const float *cos, const float *sin, int B, int T, int NH, int NKV, int HD, int pos0);
    // The transpose rotation on dq, dk inside dqkv (in place).
    void (*rope_backward)(float *dqkv, const float *cos, const float *sin, int B, int T, int NH, int NKV, int HD);

    // Causal attention. out (B,T,NH*HD); lse (B,NH,T) = log-sum-exp of each query's scaled scores.
    // window > 0: query t sees keys t-window+1 .. t only (Mistral's sliding window); 0: keys 0 .. t.
    // A backend without sliding_window support is handed window 0 or window >= T only.
    // Never materialises more than a tile of the T x T scores.
    void (*attention_forward)(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int HD,
                              int window);
    // dqkv (B,T,(NH+2NKV)*HD) is overwritten.
    void (*attention_backward)(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                               int B, int T, int NH, int NKV, int HD, int window);
    // One query position against a KV cache: q (NH*HD), k_cache/v_cache (n_ctx, NKV*HD) holding
    // positions 0..n_ctx-1 (the current one included); out (NH*HD).
    void (*attention_decode)(float *out, const float *q, const float *k_cache, const float *v_cache, int n_ctx,
                             int NH, int NKV, int HD);

    // Softmax cross-entropy over the first V of Vp columns of logits (N,Vp); targets < 0 are ignored.
    // Forward saves each row's log-sum-exp (N) and returns the summed loss of counted rows (double).
    double (*crossentropy_forward)(float *lse, const float *logits, const int *targets, int N, int V, int Vp);
    // Overwrites logits with their gradient (softmax - onehot) * dloss in one pass from the saved
    // lse: the probabilities are never stored separately. Padded columns and ignored rows get 0.
    void (*crossentropy_backward)(float *logits, const float *lse, const int *targets, int N, int V, int Vp,
                                  float dloss);

    // The training precision (sl_precision) whose rounded values the ops are handed; later GEMMs may
    // compute at it. cuda: bf16 -> CUBLAS_COMPUTE_32F_FAST_16BF, fp16 -> CUBLAS_COMPUTE_32F_FAST_16F
    // (tensor-core GEMMs on the fp32 buffers, fp32 accumulation), fp32 -> CUBLAS_COMPUTE_32F
    // (CUBLAS_COMPUTE_32F_FAST_TF32 with SHARDLM_TF32=1); cpu: nothing (OpenBLAS is fp32 throughout).
    // sl_model_forward / sl_model_backward call it with sl_model.precision; it lasts until the next call.
    void (*set_precision)(int precision);

    // ---- memory: where this backend's tensors live -------------------------------------------
    int on_device;                                   // 0: host memory (cpu); 1: GPU memory (cuda)
    // 1: activations (and the GEMMs' weight and bias arguments) are bf16 storage, see the top of this file;
    // 0: everything is fp32. cpu and cuda: 0; cpu-bf16 (ops_cpu_bf16.c, a test backend) and cuda-bf16: 1.
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
} sl_ops;

extern const sl_ops sl_ops_cpu;
// A test backend emulating the GPU's bf16 activation storage on the CPU (act_bf16 = 1): each op
// widens its storage-typed inputs to fp32, runs sl_ops_cpu's op and rounds its storage-typed outputs
// back to bf16. Slow; `--device cpu` picks it when SHARDLM_EMULATE_BF16_STORAGE=1.
extern const sl_ops sl_ops_cpu_bf16;

// The ops table for `--device cpu|cuda` ("cuda:N" picks GPU N; "cuda" the one LOCAL_RANK says, as
// torchrun does; "cpu" is sl_ops_cpu_bf16 when SHARDLM_EMULATE_BF16_STORAGE=1). Initialises the device. NULL with a message when the name is unknown, the binary
// was built without CUDA, or no usable GPU is there.
const sl_ops *sl_ops_for_device(const char *device, int local_rank);
// The table a run at `precision` (sl_precision) uses on the device of `ops` (sl_ops_for_device's
// answer): bf16 on the GPU stores activations in bf16 (sl_ops_cuda_bf16, act_bf16 = 1: half the
// activation memory, bf16 tensor-core GEMMs reading bf16 operands, as torch's autocast) unless
// SHARDLM_BF16_STORAGE=0 is set; every other case (cpu, fp32, fp16) returns ops unchanged.
const sl_ops *sl_ops_for_precision(const sl_ops *ops, int precision);
// 1 when this binary has the CUDA backend compiled in.
int sl_ops_cuda_built(void);

// Thread count for the CPU backend (OpenMP and OpenBLAS); <= 0 keeps OMP_NUM_THREADS / the default.
void sl_ops_cpu_set_threads(int n);
int sl_ops_cpu_threads(void);

#endif
