// ops_list.h: the one list of ops over activations. Everything that names every op is generated
// from SL_OPS: the fields of sl_ops (ops.h), each backend's declarations and table (cpu_ops.h,
// ops_cpu.c, cuda_ops.cuh, ops_cuda.cu), the profiler's wrappers (profile_ops.c), the bf16
// emulation's wrappers (ops_cpu_bf16.c) and the op-table tests (tests/unit/test_ops_list.c).
// A new op is an entry here, its implementation in each backend, and its tests.
//
// An entry is X(ret, name, params, args, storage, flops, emulation):
//   ret, name, params  the op's C signature: sl_ops.name has type ret (*)params;
//   args               the parameter names in order, for wrappers that call through;
//   storage            the storage-typed arguments (sl_act, see ops.h) and their element counts:
//                      SL_IN(p, n) read, SL_OUT(p, n) written, SL_INOUT(p, n) read and written in
//                      place or accumulated into; p may be NULL where the op allows it;
//   flops              what the profiler counts for one call: SL_FLOPS(expr) ("useful" work as
//                      training FLOP counters count it; 0: not counted), or SL_GEMM_FLOPS(backward,
//                      gelu, with_dinp, with_dweight) for a GEMM over (N, IC, OC): 2*N*IC*OC for a
//                      forward, that for each of dinp and dweight a backward computes (a frozen
//                      weight under LoRA has none), and the call is also totalled under its shape;
//   emulation          how the bf16-storage emulation (sl_ops_cpu_bf16) runs it: STAGED widens
//                      the storage arguments to fp32, calls the CPU op and rounds the written ones
//                      back; COMPOSED is written by hand in ops_cpu_bf16.c (a fused op whose
//                      intermediate the GPU stores rounded, or an op reading rows of a table).
// Shapes use N = B*T rows; semantics, accumulate / overwrite rules and the storage types of the
// remaining arguments are in ops.h. Element counts are size_t products.
#ifndef SHARDLM_OPS_LIST_H
#define SHARDLM_OPS_LIST_H

#define SL_N2(a, b) ((size_t)(a) * (size_t)(b))
#define SL_N3(a, b, c) ((size_t)(a) * (size_t)(b) * (size_t)(c))

#define SL_OPS(X)                                                                                           \
    /* out (B,T,C) = wte[inp] (+ wpe[t]); wpe may be NULL (LLaMA). */                                       \
    X(void, encoder_forward,                                                                                \
      (sl_act *out, const int *inp, const sl_act *wte, const sl_act *wpe, int B, int T, int C),             \
      (out, inp, wte, wpe, B, T, C),                                                                        \
      SL_OUT(out, SL_N3(B, T, C)) SL_IN(wte, /* the rows inp names */) SL_IN(wpe, SL_N2(T, C)),             \
      SL_FLOPS(0), COMPOSED)                                                                                \
    /* dwte[inp] += dout; dwpe[t] += dout (dwpe may be NULL). */                                            \
    X(void, encoder_backward,                                                                               \
      (float *dwte, float *dwpe, const sl_act *dout, const int *inp, int B, int T, int C),                  \
      (dwte, dwpe, dout, inp, B, T, C),                                                                     \
      SL_IN(dout, SL_N3(B, T, C)),                                                                          \
      SL_FLOPS(0), STAGED)                                                                                  \
    /* out (N,OC) = inp (N,IC) @ weight^T (OC,IC) + bias (OC) (bias may be NULL). */                        \
    X(void, matmul_forward,                                                                                 \
      (sl_act *out, const sl_act *inp, const sl_act *weight, const sl_act *bias, int N, int IC, int OC),    \
      (out, inp, weight, bias, N, IC, OC),                                                                  \
      SL_IN(inp, SL_N2(N, IC)) SL_IN(weight, SL_N2(OC, IC)) SL_IN(bias, (size_t)OC)                         \
      SL_OUT(out, SL_N2(N, OC)),                                                                            \
      SL_GEMM_FLOPS(0, 0, 1, 0), STAGED)                                                                          \
    /* dinp (N,IC) = dout @ weight (skipped if dinp NULL); dweight += dout^T @ inp (skipped if NULL:       \
       a frozen weight); dbias += colsum(dout) (dbias may be NULL). */                                                        \
    X(void, matmul_backward,                                                                                \
      (sl_act *dinp, float *dweight, float *dbias, const sl_act *dout, const sl_act *inp,                   \
       const sl_act *weight, int N, int IC, int OC),                                                        \
      (dinp, dweight, dbias, dout, inp, weight, N, IC, OC),                                                 \
      SL_IN(dout, SL_N2(N, OC)) SL_IN(inp, SL_N2(N, IC)) SL_IN(weight, SL_N2(OC, IC))                       \
      SL_OUT(dinp, SL_N2(N, IC)),                                                                           \
      SL_GEMM_FLOPS(1, 0, dinp != NULL, dweight != NULL), STAGED)                                                                          \
    /* GPT-2's MLP up-projection fused with its tanh GELU: pre (N,OC) = inp @ weight^T + bias,              \
       out = gelu(pre); pre is saved for backward. Equal to matmul_forward then gelu_forward. */            \
    X(void, matmul_gelu_forward,                                                                            \
      (sl_act *out, sl_act *pre, const sl_act *inp, const sl_act *weight, const sl_act *bias, int N,       \
       int IC, int OC),                                                                                     \
      (out, pre, inp, weight, bias, N, IC, OC),                                                             \
      SL_IN(inp, SL_N2(N, IC)) SL_IN(weight, SL_N2(OC, IC)) SL_IN(bias, (size_t)OC)                         \
      SL_OUT(out, SL_N2(N, OC)) SL_OUT(pre, SL_N2(N, OC)),                                                  \
      SL_GEMM_FLOPS(0, 1, 1, 0), STAGED)                                                                          \
    /* dout (N,OC) is OVERWRITTEN with the pre-GELU gradient dout * gelu'(pre), then exactly                \
       matmul_backward with it. Equal to gelu_backward then matmul_backward. */                             \
    X(void, matmul_gelu_backward,                                                                           \
      (sl_act *dinp, float *dweight, float *dbias, sl_act *dout, const sl_act *pre, const sl_act *inp,      \
       const sl_act *weight, int N, int IC, int OC),                                                        \
      (dinp, dweight, dbias, dout, pre, inp, weight, N, IC, OC),                                            \
      SL_INOUT(dout, SL_N2(N, OC)) SL_IN(pre, SL_N2(N, OC)) SL_IN(inp, SL_N2(N, IC))                        \
      SL_IN(weight, SL_N2(OC, IC)) SL_OUT(dinp, SL_N2(N, IC)),                                              \
      SL_GEMM_FLOPS(1, 1, dinp != NULL, dweight != NULL), COMPOSED)                                                                        \
    /* The backward of a linear whose input was gelu(pre) (GPT-2's MLP down-projection): dinp (N,IC) =     \
       (dout @ weight) * gelu'(pre), the gradient of pre (skipped if dinp NULL); dweight, dbias as in       \
       matmul_backward. Equal to matmul_backward then gelu_backward on dinp in place. */                    \
    X(void, matmul_backward_gelu,                                                                           \
      (sl_act *dinp, float *dweight, float *dbias, const sl_act *dout, const sl_act *inp,                   \
       const sl_act *weight, const sl_act *pre, int N, int IC, int OC),                                     \
      (dinp, dweight, dbias, dout, inp, weight, pre, N, IC, OC),                                            \
      SL_IN(dout, SL_N2(N, OC)) SL_IN(inp, SL_N2(N, IC)) SL_IN(weight, SL_N2(OC, IC))                       \
      SL_IN(pre, SL_N2(N, IC)) SL_OUT(dinp, SL_N2(N, IC)),                                                  \
      SL_GEMM_FLOPS(1, 2, dinp != NULL, dweight != NULL), COMPOSED)                                                          \
    /* out (N,C) = (inp - mean) * rstd * w + b; saves mean, rstd (N). */                                    \
    X(void, layernorm_forward,                                                                              \
      (sl_act *out, float *mean, float *rstd, const sl_act *inp, const sl_act *w, const sl_act *b, int N,  \
       int C, float eps),                                                                                   \
      (out, mean, rstd, inp, w, b, N, C, eps),                                                              \
      SL_IN(inp, SL_N2(N, C)) SL_IN(w, (size_t)C) SL_IN(b, (size_t)C) SL_OUT(out, SL_N2(N, C)),             \
      SL_FLOPS(0), STAGED)                                                                                  \
    /* dinp += ..., dw += ..., db += ... (dw, db NULL: frozen, only dinp; on the CPU db alone: LoRA's bias) */  \
    X(void, layernorm_backward,                                                                             \
      (sl_act *dinp, float *dw, float *db, const sl_act *dout, const sl_act *inp, const sl_act *w,          \
       const float *mean, const float *rstd, int N, int C),                                                 \
      (dinp, dw, db, dout, inp, w, mean, rstd, N, C),                                                       \
      SL_INOUT(dinp, SL_N2(N, C)) SL_IN(dout, SL_N2(N, C)) SL_IN(inp, SL_N2(N, C)) SL_IN(w, (size_t)C),    \
      SL_FLOPS(0), STAGED)                                                                                  \
    /* out (N,C) = inp * rstd * w with rstd = 1/sqrt(mean(inp^2) + eps); saves rstd (N). */                 \
    X(void, rmsnorm_forward,                                                                                \
      (sl_act *out, float *rstd, const sl_act *inp, const sl_act *w, int N, int C, float eps),              \
      (out, rstd, inp, w, N, C, eps),                                                                       \
      SL_IN(inp, SL_N2(N, C)) SL_IN(w, (size_t)C) SL_OUT(out, SL_N2(N, C)),                                 \
      SL_FLOPS(0), STAGED)                                                                                  \
    /* dinp += ..., dw += ... (dw NULL: frozen, only dinp) */                                                                            \
    X(void, rmsnorm_backward,                                                                               \
      (sl_act *dinp, float *dw, const sl_act *dout, const sl_act *inp, const sl_act *w, const float *rstd, \
       int N, int C),                                                                                       \
      (dinp, dw, dout, inp, w, rstd, N, C),                                                                 \
      SL_INOUT(dinp, SL_N2(N, C)) SL_IN(dout, SL_N2(N, C)) SL_IN(inp, SL_N2(N, C)) SL_IN(w, (size_t)C),    \
      SL_FLOPS(0), STAGED)                                                                                  \
    /* out = a + b (n); out may be a or b. */                                                               \
    X(void, residual_forward,                                                                               \
      (sl_act *out, const sl_act *a, const sl_act *b, size_t n),                                            \
      (out, a, b, n),                                                                                       \
      SL_IN(a, n) SL_IN(b, n) SL_OUT(out, n),                                                               \
      SL_FLOPS(0), STAGED)                                                                                  \
    /* resid (N,C) = a + b (resid may be a or b), then out = layernorm(resid) saving mean, rstd:            \
       the same values as residual_forward followed by layernorm_forward. */                                \
    X(void, residual_layernorm_forward,                                                                     \
      (sl_act *resid, sl_act *out, float *mean, float *rstd, const sl_act *a, const sl_act *b,              \
       const sl_act *w, const sl_act *bias, int N, int C, float eps),                                       \
      (resid, out, mean, rstd, a, b, w, bias, N, C, eps),                                                   \
      SL_IN(a, SL_N2(N, C)) SL_IN(b, SL_N2(N, C)) SL_IN(w, (size_t)C) SL_IN(bias, (size_t)C)                \
      SL_OUT(resid, SL_N2(N, C)) SL_OUT(out, SL_N2(N, C)),                                                  \
      SL_FLOPS(0), COMPOSED)                                                                                \
    /* resid = a + b, then out = rmsnorm(resid) saving rstd. */                                             \
    X(void, residual_rmsnorm_forward,                                                                       \
      (sl_act *resid, sl_act *out, float *rstd, const sl_act *a, const sl_act *b, const sl_act *w, int N,  \
       int C, float eps),                                                                                   \
      (resid, out, rstd, a, b, w, N, C, eps),                                                               \
      SL_IN(a, SL_N2(N, C)) SL_IN(b, SL_N2(N, C)) SL_IN(w, (size_t)C)                                       \
      SL_OUT(resid, SL_N2(N, C)) SL_OUT(out, SL_N2(N, C)),                                                  \
      SL_FLOPS(0), COMPOSED)                                                                                \
    /* LoRA's adapter on a slice of a fused linear's output: out (N,ld)[:, col0:col0+W] += scale * inp    \
       (N,W). */                                                                                            \
    X(void, add_columns,                                                                                    \
      (sl_act *out, const sl_act *inp, float scale, int N, int W, int ld, int col0),                        \
      (out, inp, scale, N, W, ld, col0),                                                                    \
      SL_INOUT(out, SL_N2(N, ld)) SL_IN(inp, SL_N2(N, W)),                                                  \
      SL_FLOPS(0), STAGED)                                                                                  \
    /* Its backward's slice of the output gradient: out (N,W) = scale * inp (N,ld)[:, col0:col0+W]. */     \
    X(void, take_columns,                                                                                   \
      (sl_act *out, const sl_act *inp, float scale, int N, int W, int ld, int col0),                        \
      (out, inp, scale, N, W, ld, col0),                                                                    \
      SL_IN(inp, SL_N2(N, ld)) SL_OUT(out, SL_N2(N, W)),                                                    \
      SL_FLOPS(0), STAGED)                                                                                  \
    /* One LoRA adapter (A (r,in), B (out,r)) on a slice of a linear's output: u (N,r) = x (N,in) @ A^T,   \
       y (N,ld)[:, col0:col0+out] += scale * (u @ B^T). delta (N,out) is scratch a backend may use (the    \
       composed ones hold u @ B^T there); the CPU's runs both GEMMs straight into u and y. */              \
    X(void, lora_forward,                                                                                   \
      (sl_act *y, sl_act *u, sl_act *delta, const sl_act *x, const sl_act *A, const sl_act *B, float scale, \
       int N, int in, int r, int out, int ld, int col0),                                                    \
      (y, u, delta, x, A, B, scale, N, in, r, out, ld, col0),                                               \
      SL_IN(x, SL_N2(N, in)) SL_IN(A, SL_N2(r, in)) SL_IN(B, SL_N2(out, r)) SL_OUT(u, SL_N2(N, r))          \
      SL_INOUT(y, SL_N2(N, ld)),                                                                            \
      SL_FLOPS(2.0 * N * r * ((double)in + out)), COMPOSED)                                                 \
    /* Its backward, g = scale * dy (N,ld)[:, col0:col0+out]: dB (out,r) += g^T @ u; du (N,r) = g @ B;     \
       dA (r,in) += du^T @ x; dx (N,in) += du @ A (skipped if dx NULL). delta (N,out) and dh (N,in) are    \
       scratch a backend may use. */                                                                        \
    X(void, lora_backward,                                                                                  \
      (sl_act *dx, float *dA, float *dB, sl_act *du, sl_act *delta, sl_act *dh, const sl_act *dy,          \
       const sl_act *x, const sl_act *u, const sl_act *A, const sl_act *B, float scale, int N, int in,     \
       int r, int out, int ld, int col0),                                                                   \
      (dx, dA, dB, du, delta, dh, dy, x, u, A, B, scale, N, in, r, out, ld, col0),                          \
      SL_IN(dy, SL_N2(N, ld)) SL_IN(x, SL_N2(N, in)) SL_IN(u, SL_N2(N, r)) SL_IN(A, SL_N2(r, in))         \
      SL_IN(B, SL_N2(out, r)) SL_OUT(du, SL_N2(N, r)) SL_INOUT(dx, SL_N2(N, in)),                           \
      SL_FLOPS(2.0 * N * r * (2.0 * out + in + (dx ? in : 0))), COMPOSED)                                   \
    /* Inverted dropout with probability p: out (n) = inp * keep / (1 - p), keep[i] = sl_dropout_keep(     \
       seed, i, p), a pure function of (seed, i) (ops.h); out may be inp. */                                \
    X(void, dropout_forward, (sl_act *out, const sl_act *inp, size_t n, float p, uint64_t seed),            \
      (out, inp, n, p, seed), SL_IN(inp, n) SL_OUT(out, n), SL_FLOPS(0), STAGED)                            \
    /* dinp (n) = dout * keep / (1 - p), the forward's keep for the same seed (OVERWRITTEN; may be dout). */ \
    X(void, dropout_backward, (sl_act *dinp, const sl_act *dout, size_t n, float p, uint64_t seed),         \
      (dinp, dout, n, p, seed), SL_IN(dout, n) SL_OUT(dinp, n), SL_FLOPS(0), STAGED)                        \
    /* tanh-approximate GELU ("gelu_new"). */                                                               \
    X(void, gelu_forward, (sl_act *out, const sl_act *inp, size_t n), (out, inp, n),                        \
      SL_IN(inp, n) SL_OUT(out, n), SL_FLOPS(0), STAGED)                                                    \
    X(void, gelu_backward, (sl_act *dinp, const sl_act *inp, const sl_act *dout, size_t n),                 \
      (dinp, inp, dout, n),                                                                                 \
      SL_IN(inp, n) SL_IN(dout, n) SL_OUT(dinp, n), SL_FLOPS(0), STAGED)                                    \
    /* out (N,I) = silu(inp[:, :I]) * inp[:, I:]; inp (N, 2I) is the fused gate|up projection. */           \
    X(void, swiglu_forward, (sl_act *out, const sl_act *inp, int N, int I), (out, inp, N, I),               \
      SL_IN(inp, SL_N3(N, 2, I)) SL_OUT(out, SL_N2(N, I)), SL_FLOPS(0), STAGED)                             \
    X(void, swiglu_backward, (sl_act *dinp, const sl_act *inp, const sl_act *dout, int N, int I),           \
      (dinp, inp, dout, N, I),                                                                              \
      SL_IN(inp, SL_N3(N, 2, I)) SL_IN(dout, SL_N2(N, I)) SL_OUT(dinp, SL_N3(N, 2, I)),                     \
      SL_FLOPS(0), STAGED)                                                                                  \
    /* Rotary embeddings (rotate-half, as LlamaForCausalLM) in place on the q and k heads of qkv            \
       (B,T,(NH+2NKV)*HD) for positions pos0..pos0+T-1; cos / sin are (max_T, HD/2) fp32 tables. */        \
    X(void, rope_forward,                                                                                   \
      (sl_act *qkv, const float *cos, const float *sin, int B, int T, int NH, int NKV, int HD, int pos0),  \
      (qkv, cos, sin, B, T, NH, NKV, HD, pos0),                                                             \
      SL_INOUT(qkv, SL_N3(B, T, (NH + 2 * NKV) * HD)), SL_FLOPS(0), STAGED)                                 \
    /* The transpose rotation on dq, dk inside dqkv (in place). */                                          \
    X(void, rope_backward,                                                                                  \
      (sl_act *dqkv, const float *cos, const float *sin, int B, int T, int NH, int NKV, int HD),            \
      (dqkv, cos, sin, B, T, NH, NKV, HD),                                                                  \
      SL_INOUT(dqkv, SL_N3(B, T, (NH + 2 * NKV) * HD)), SL_FLOPS(0), STAGED)                                \
    /* Causal attention: out (B,T,NH*HD); lse (B,NH,T) = log-sum-exp of each query's scaled scores.         \
       window > 0: query t sees keys t-window+1 .. t (Mistral); 0: keys 0 .. t. Counted: q.k and p*v,       \
       4*HD per (query, key) pair per head. */                                                              \
    X(void, attention_forward,                                                                              \
      (sl_act *out, float *lse, const sl_act *qkv, int B, int T, int NH, int NKV, int HD, int window),     \
      (out, lse, qkv, B, T, NH, NKV, HD, window),                                                           \
      SL_IN(qkv, SL_N3(B, T, (NH + 2 * NKV) * HD)) SL_OUT(out, SL_N3(B, T, NH * HD)),                       \
      SL_FLOPS(4.0 * HD * sl_causal_pairs(B, T, NH, window)), STAGED)                                       \
    /* dqkv (B,T,(NH+2NKV)*HD) is overwritten. Counted: twice the forward (the recomputed scores            \
       are not counted). */                                                                                 \
    X(void, attention_backward,                                                                             \
      (sl_act *dqkv, const sl_act *dout, const sl_act *qkv, const sl_act *out, const float *lse, int B,    \
       int T, int NH, int NKV, int HD, int window),                                                         \
      (dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD, window),                                               \
      SL_IN(dout, SL_N3(B, T, NH * HD)) SL_IN(qkv, SL_N3(B, T, (NH + 2 * NKV) * HD))                        \
      SL_IN(out, SL_N3(B, T, NH * HD)) SL_OUT(dqkv, SL_N3(B, T, (NH + 2 * NKV) * HD)),                      \
      SL_FLOPS(8.0 * HD * sl_causal_pairs(B, T, NH, window)), STAGED)                                       \
    /* One query position against a KV cache: q (NH*HD), k_cache / v_cache (n_ctx, NKV*HD) holding          \
       positions 0..n_ctx-1 (the current one included); out (NH*HD). */                                     \
    X(void, attention_decode,                                                                               \
      (sl_act *out, const sl_act *q, const sl_act *k_cache, const sl_act *v_cache, int n_ctx, int NH,      \
       int NKV, int HD),                                                                                    \
      (out, q, k_cache, v_cache, n_ctx, NH, NKV, HD),                                                       \
      SL_IN(q, SL_N2(NH, HD)) SL_IN(k_cache, SL_N3(n_ctx, NKV, HD)) SL_IN(v_cache, SL_N3(n_ctx, NKV, HD))   \
      SL_OUT(out, SL_N2(NH, HD)),                                                                           \
      SL_FLOPS(4.0 * HD * (double)n_ctx * NH), STAGED)                                                      \
    /* Softmax cross-entropy over the first V of Vp columns of logits (N,Vp); targets < 0 are ignored.      \
       Saves each row's log-sum-exp (N) and returns the summed loss of counted rows. */                     \
    X(double, crossentropy_forward,                                                                         \
      (float *lse, const sl_act *logits, const int *targets, int N, int V, int Vp),                         \
      (lse, logits, targets, N, V, Vp),                                                                     \
      SL_IN(logits, SL_N2(N, Vp)), SL_FLOPS(0), STAGED)                                                     \
    /* Overwrites logits with their gradient (softmax - onehot) * dloss from the saved lse; padded          \
       columns and ignored rows get 0. */                                                                   \
    X(void, crossentropy_backward,                                                                          \
      (sl_act *logits, const float *lse, const int *targets, int N, int V, int Vp, float dloss),           \
      (logits, lse, targets, N, V, Vp, dloss),                                                              \
      SL_INOUT(logits, SL_N2(N, Vp)), SL_FLOPS(0), STAGED)                                                  \
    /* crossentropy_forward then crossentropy_backward in one call (training's fused classifier: one        \
       pass over the logits on the GPU): the same lse, returned loss and gradient over the logits. */       \
    X(double, crossentropy_fused,                                                                           \
      (float *lse, sl_act *logits, const int *targets, int N, int V, int Vp, float dloss),                  \
      (lse, logits, targets, N, V, Vp, dloss),                                                              \
      SL_INOUT(logits, SL_N2(N, Vp)), SL_FLOPS(0), STAGED)

// Causal (query, key) pairs over all heads and batch rows: each query sees min(t + 1, window) keys.
static inline double sl_causal_pairs(int B, int T, int NH, int window) {
    double w = window > 0 && window < T ? window : T;
    return (double)B * NH * (w * (w + 1) / 2.0 + ((double)T - w) * w);
}

#endif
