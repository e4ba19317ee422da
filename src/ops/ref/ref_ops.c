// ref_ops.c: the double-precision reference ops (see ref_ops.h). Straight loops, no tiling, no
// threads: clarity over speed. Gradient conventions are those of ops.h.
#include "ops/ref/ref_ops.h"
#include "shardlm/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ref_encoder_forward(double *out, const int *inp, const double *wte, const double *wpe, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                size_t n = (size_t)b * T + t;
                out[n * C + c] = wte[(size_t)inp[n] * C + c] + (wpe ? wpe[(size_t)t * C + c] : 0.0);
            }
}

void ref_encoder_backward(double *dwte, double *dwpe, const double *dout, const int *inp, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                size_t n = (size_t)b * T + t;
                dwte[(size_t)inp[n] * C + c] += dout[n * C + c];
                if (dwpe) dwpe[(size_t)t * C + c] += dout[n * C + c];
            }
}

void ref_matmul_forward(double *out, const double *inp, const double *w, const double *b, int N, int IC, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = b ? b[o] : 0.0;
            for (int i = 0; i < IC; i++) s += inp[(size_t)n * IC + i] * w[(size_t)o * IC + i];
            out[(size_t)n * OC + o] = s;
        }
}

void ref_matmul_backward(double *dinp, double *dw, double *db, const double *dout, const double *inp, const double *w,
                         int N, int IC, int OC) {
    for (int n = 0; n < N; n++) {
        for (int i = 0; i < IC && dinp; i++) {
            double s = 0.0;
            for (int o = 0; o < OC; o++) s += dout[(size_t)n * OC + o] * w[(size_t)o * IC + i];
            dinp[(size_t)n * IC + i] = s;
        }
        for (int o = 0; o < OC; o++) {
            double d = dout[(size_t)n * OC + o];
            for (int i = 0; i < IC; i++) dw[(size_t)o * IC + i] += d * inp[(size_t)n * IC + i];
            if (db) db[o] += d;
        }
    }
}

void ref_layernorm_forward(double *out, double *mean, double *rstd, const double *inp, const double *w,
                           const double *b, int N, int C, double eps) {
    for (int n = 0; n < N; n++) {
        const double *x = inp + (size_t)n * C;
        double m = 0.0, v = 0.0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        v /= C;
        double r = 1.0 / sqrt(v + eps);
        for (int c = 0; c < C; c++) out[(size_t)n * C + c] = (x[c] - m) * r * w[c] + b[c];
        mean[n] = m;
        rstd[n] = r;
    }
}

void ref_layernorm_backward(double *dinp, double *dw, double *db, const double *dout, const double *inp,
                            const double *w, const double *mean, const double *rstd, int N, int C) {
    for (int n = 0; n < N; n++) {
        const double *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
        double mean_dnorm = 0.0, mean_dnorm_xhat = 0.0;
        for (int c = 0; c < C; c++) {
            double xhat = (x[c] - mean[n]) * rstd[n];
            double dnorm = dy[c] * w[c];
            mean_dnorm += dnorm;
            mean_dnorm_xhat += dnorm * xhat;
            dw[c] += dy[c] * xhat;
            db[c] += dy[c];
        }
        mean_dnorm /= C;
        mean_dnorm_xhat /= C;
        for (int c = 0; c < C; c++) {
            double xhat = (x[c] - mean[n]) * rstd[n];
            dinp[(size_t)n * C + c] += (dy[c] * w[c] - mean_dnorm - xhat * mean_dnorm_xhat) * rstd[n];
        }
    }
}

void ref_rmsnorm_forward(double *out, double *rstd, const double *inp, const double *w, int N, int C, double eps) {
    for (int n = 0; n < N; n++) {
        const double *x = inp + (size_t)n * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++) ss += x[c] * x[c];
        double r = 1.0 / sqrt(ss / C + eps);
        for (int c = 0; c < C; c++) out[(size_t)n * C + c] = x[c] * r * w[c];
        rstd[n] = r;
    }
}

void ref_rmsnorm_backward(double *dinp, double *dw, const double *dout, const double *inp, const double *w,
                          const double *rstd, int N, int C) {
    for (int n = 0; n < N; n++) {
        const double *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
        double dot = 0.0;
        for (int c = 0; c < C; c++) {
            dot += dy[c] * w[c] * x[c];
            dw[c] += dy[c] * x[c] * rstd[n];
        }
        double r3 = rstd[n] * rstd[n] * rstd[n] / C;
        for (int c = 0; c < C; c++) dinp[(size_t)n * C + c] += dy[c] * w[c] * rstd[n] - x[c] * dot * r3;
    }
}

static const double GELU_K = 0.7978845608028654;  // sqrt(2/pi)

void ref_add_columns(double *out, const double *inp, double scale, int N, int W, int ld, int col0) {
    for (int n = 0; n < N; n++)
        for (int j = 0; j < W; j++) out[(size_t)n * ld + col0 + j] += scale * inp[(size_t)n * W + j];
}

void ref_take_columns(double *out, const double *inp, double scale, int N, int W, int ld, int col0) {
    for (int n = 0; n < N; n++)
        for (int j = 0; j < W; j++) out[(size_t)n * W + j] = scale * inp[(size_t)n * ld + col0 + j];
}

void ref_dropout(double *out, const double *inp, size_t n, double p, uint64_t seed) {
    for (size_t i = 0; i < n; i++) out[i] = sl_dropout_keep(seed, i, (float)p) ? inp[i] / (1.0 - p) : 0.0;
}

void ref_gelu_forward(double *out, const double *inp, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double x = inp[i];
        out[i] = 0.5 * x * (1.0 + tanh(GELU_K * (x + 0.044715 * x * x * x)));
    }
}

void ref_gelu_backward(double *dinp, const double *inp, const double *dout, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double x = inp[i], u = GELU_K * (x + 0.044715 * x * x * x), th = tanh(u);
        double du = GELU_K * (1.0 + 3.0 * 0.044715 * x * x);
        dinp[i] = dout[i] * (0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du);
    }
}

void ref_swiglu_forward(double *out, const double *inp, int N, int I) {
    for (int n = 0; n < N; n++)
        for (int i = 0; i < I; i++) {
            double g = inp[(size_t)n * 2 * I + i], u = inp[(size_t)n * 2 * I + I + i];
            out[(size_t)n * I + i] = g / (1.0 + exp(-g)) * u;
        }
}

void ref_swiglu_backward(double *dinp, const double *inp, const double *dout, int N, int I) {
    for (int n = 0; n < N; n++)
        for (int i = 0; i < I; i++) {
            double g = inp[(size_t)n * 2 * I + i], u = inp[(size_t)n * 2 * I + I + i];
            double s = 1.0 / (1.0 + exp(-g)), d = dout[(size_t)n * I + i];
            dinp[(size_t)n * 2 * I + i] = d * u * s * (1.0 + g * (1.0 - s));
            dinp[(size_t)n * 2 * I + I + i] = d * g * s;
        }
}

// Rotates the first NH+NKV heads (q and k) of each row; `sign` = +1 forward, -1 transpose.
static void ref_rope_apply(double *qkv, const double *cos, const double *sin, int B, int T, int NH, int NKV, int HD,
                           int pos0, double sign) {
    int W = (NH + 2 * NKV) * HD, half = HD / 2;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH + NKV; h++) {
                double *x = qkv + ((size_t)b * T + t) * W + (size_t)h * HD;
                for (int i = 0; i < half; i++) {
                    double c = cos[(size_t)(pos0 + t) * half + i], s = sign * sin[(size_t)(pos0 + t) * half + i];
                    double x1 = x[i], x2 = x[i + half];
                    x[i] = x1 * c - x2 * s;
                    x[i + half] = x2 * c + x1 * s;
                }
            }
}

void ref_rope_forward(double *qkv, const double *cos, const double *sin, int B, int T, int NH, int NKV, int HD, int pos0) {
    ref_rope_apply(qkv, cos, sin, B, T, NH, NKV, HD, pos0, 1.0);
}

void ref_rope_backward(double *dqkv, const double *cos, const double *sin, int B, int T, int NH, int NKV, int HD) {
    ref_rope_apply(dqkv, cos, sin, B, T, NH, NKV, HD, 0, -1.0);
}

void ref_attention_forward(double *out, const double *qkv, int B, int T, int NH, int NKV, int HD, int window) {
    int W = (NH + 2 * NKV) * HD, group = NH / NKV;
    double scale = 1.0 / sqrt((double)HD);
    double *p = malloc(sizeof(double) * (size_t)T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            int g = h / group;
            for (int t = 0; t < T; t++) {
                const double *q = qkv + ((size_t)b * T + t) * W + (size_t)h * HD;
                double mx = -INFINITY, sum = 0.0;
                int j0 = window > 0 && t - window + 1 > 0 ? t - window + 1 : 0;
                for (int j = j0; j <= t; j++) {
                    const double *k = qkv + ((size_t)b * T + j) * W + (size_t)(NH + g) * HD;
                    double s = 0.0;
                    for (int i = 0; i < HD; i++) s += q[i] * k[i];
                    p[j] = s * scale;
                    if (p[j] > mx) mx = p[j];
                }
                for (int j = j0; j <= t; j++) sum += (p[j] = exp(p[j] - mx));
                double *o = out + ((size_t)b * T + t) * NH * HD + (size_t)h * HD;
                for (int i = 0; i < HD; i++) o[i] = 0.0;
                for (int j = j0; j <= t; j++) {
                    const double *v = qkv + ((size_t)b * T + j) * W + (size_t)(NH + NKV + g) * HD;
                    for (int i = 0; i < HD; i++) o[i] += p[j] / sum * v[i];
                }
            }
        }
    free(p);
}

void ref_attention_backward(double *dqkv, const double *dout, const double *qkv, int B, int T, int NH, int NKV, int HD,
                            int window) {
    int W = (NH + 2 * NKV) * HD, group = NH / NKV;
    double scale = 1.0 / sqrt((double)HD);
    double *p = malloc(sizeof(double) * (size_t)T), *dp = malloc(sizeof(double) * (size_t)T);
    memset(dqkv, 0, sizeof(double) * (size_t)B * T * W);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            int g = h / group;
            for (int t = 0; t < T; t++) {
                const double *q = qkv + ((size_t)b * T + t) * W + (size_t)h * HD;
                const double *dO = dout + ((size_t)b * T + t) * NH * HD + (size_t)h * HD;
                double mx = -INFINITY, sum = 0.0;
                int j0 = window > 0 && t - window + 1 > 0 ? t - window + 1 : 0;
                for (int j = j0; j <= t; j++) {
                    const double *k = qkv + ((size_t)b * T + j) * W + (size_t)(NH + g) * HD;
                    double s = 0.0;
                    for (int i = 0; i < HD; i++) s += q[i] * k[i];
                    p[j] = s * scale;
                    if (p[j] > mx) mx = p[j];
                }
                for (int j = j0; j <= t; j++) sum += (p[j] = exp(p[j] - mx));
                double pdp = 0.0;
                for (int j = j0; j <= t; j++) {
                    p[j] /= sum;
                    const double *v = qkv + ((size_t)b * T + j) * W + (size_t)(NH + NKV + g) * HD;
                    double s = 0.0;
                    for (int i = 0; i < HD; i++) s += dO[i] * v[i];
                    dp[j] = s;
                    pdp += p[j] * s;
                }
                double *dq = dqkv + ((size_t)b * T + t) * W + (size_t)h * HD;
                for (int j = j0; j <= t; j++) {
                    double ds = p[j] * (dp[j] - pdp) * scale;
                    const double *k = qkv + ((size_t)b * T + j) * W + (size_t)(NH + g) * HD;
                    double *dk = dqkv + ((size_t)b * T + j) * W + (size_t)(NH + g) * HD;
                    double *dv = dqkv + ((size_t)b * T + j) * W + (size_t)(NH + NKV + g) * HD;
                    for (int i = 0; i < HD; i++) {
                        dq[i] += ds * k[i];
                        dk[i] += ds * q[i];
                        dv[i] += p[j] * dO[i];
                    }
                }
            }
        }
    free(p);
    free(dp);
}

double ref_crossentropy(double *dlogits, const double *logits, const int *targets, int N, int V, int Vp) {
    int count = 0;
    for (int n = 0; n < N; n++) count += targets[n] >= 0;
    double loss = 0.0;
    for (int n = 0; n < N; n++) {
        const double *x = logits + (size_t)n * Vp;
        double mx = -INFINITY, sum = 0.0;
        for (int v = 0; v < V; v++) if (x[v] > mx) mx = x[v];
        for (int v = 0; v < V; v++) sum += exp(x[v] - mx);
        double lse = mx + log(sum);
        if (targets[n] >= 0) loss += lse - x[targets[n]];
        if (!dlogits) continue;
        for (int v = 0; v < Vp; v++) {
            double g = 0.0;
            if (targets[n] >= 0 && v < V) g = (exp(x[v] - lse) - (v == targets[n])) / count;
            dlogits[(size_t)n * Vp + v] = g;
        }
    }
    return count ? loss / count : 0.0;
}
