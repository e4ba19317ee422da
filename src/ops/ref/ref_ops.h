// ref_ops.h: plain, obviously-correct double-precision versions of every op in ops.h, used only by
// tests: their backward is checked against finite differences of their forward, and the fast
// backends are checked against them. Same argument order and gradient conventions as ops.h,
// except that attention materialises the full T x T matrix (it is a reference, not a kernel).
#ifndef SHARDLM_REF_OPS_H
#define SHARDLM_REF_OPS_H

#include <stddef.h>
#include <stdint.h>

void ref_encoder_forward(double *out, const int *inp, const double *wte, const double *wpe, int B, int T, int C);
void ref_encoder_backward(double *dwte, double *dwpe, const double *dout, const int *inp, int B, int T, int C);
void ref_matmul_forward(double *out, const double *inp, const double *w, const double *b, int N, int IC, int OC);
void ref_matmul_backward(double *dinp, double *dw, double *db, const double *dout, const double *inp, const double *w,
                         int N, int IC, int OC);
void ref_layernorm_forward(double *out, double *mean, double *rstd, const double *inp, const double *w,
                           const double *b, int N, int C, double eps);
void ref_layernorm_backward(double *dinp, double *dw, double *db, const double *dout, const double *inp,
                            const double *w, const double *mean, const double *rstd, int N, int C);
void ref_rmsnorm_forward(double *out, double *rstd, const double *inp, const double *w, int N, int C, double eps);
void ref_rmsnorm_backward(double *dinp, double *dw, const double *dout, const double *inp, const double *w,
                          const double *rstd, int N, int C);
// LoRA's column slices (ops_list.h add_columns / take_columns) and inverted dropout (sl_dropout_keep).
void ref_add_columns(double *out, const double *inp, double scale, int N, int W, int ld, int col0);
void ref_take_columns(double *out, const double *inp, double scale, int N, int W, int ld, int col0);
void ref_dropout(double *out, const double *inp, size_t n, double p, uint64_t seed);
void ref_gelu_forward(double *out, const double *inp, size_t n);
void ref_gelu_backward(double *dinp, const double *inp, const double *dout, size_t n);
void ref_swiglu_forward(double *out, const double *inp, int N, int I);
void ref_swiglu_backward(double *dinp, const double *inp, const double *dout, int N, int I);
void ref_rope_forward(double *qkv, const double *cos, const double *sin, int B, int T, int NH, int NKV, int HD, int pos0);
void ref_rope_backward(double *dqkv, const double *cos, const double *sin, int B, int T, int NH, int NKV, int HD);
// window > 0: query t sees keys t-window+1 .. t (sliding window); 0: all keys up to t.
void ref_attention_forward(double *out, const double *qkv, int B, int T, int NH, int NKV, int HD, int window);
void ref_attention_backward(double *dqkv, const double *dout, const double *qkv, int B, int T, int NH, int NKV, int HD,
                            int window);
// Mean loss over rows with target >= 0; dlogits (N,Vp) = d(mean loss)/d logits (may be NULL).
double ref_crossentropy(double *dlogits, const double *logits, const int *targets, int N, int V, int Vp);

#endif
