// rope.c: RoPE inverse frequencies for transformers' rope_type values, and the cos/sin tables the
// rope ops read (see rope.h). The arithmetic is float32 where transformers' is (its tensors), double
// where transformers computes with Python floats (yarn's correction range and mscale).
#include "shardlm/rope.h"

#include <math.h>
#include <stdlib.h>

// 1 / theta^(2i/dim), as torch computes it from an arange in float32.
static float default_inv_freq(float theta, int i, int dim) { return 1.0f / powf(theta, (float)(2 * i) / (float)dim); }

// Llama 3.1: long wavelengths divided by factor, short ones kept, a smooth ramp between.
static float llama3(const sl_rope_config *r, float f) {
    float old = (float)r->original_max_position_embeddings, lo = r->low_freq_factor, hi = r->high_freq_factor;
    float wavelen = (float)(2.0 * M_PI) / f;
    if (wavelen > old / lo) return f / r->factor;
    if (wavelen < old / hi) return f;
    float smooth = (old / wavelen - lo) / (hi - lo);
    return (1.0f - smooth) * f / r->factor + smooth * f;
}

static double yarn_mscale(double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

// The dimension at which a frequency completes `rotations` turns over the original context.
static double yarn_correction_dim(double rotations, int dim, double theta, double orig) {
    return dim * log(orig / (rotations * 2.0 * M_PI)) / (2.0 * log(theta));
}

static void yarn(const sl_rope_config *r, int dim, float *inv_freq, float *scale) {
    double theta = r->theta, factor = r->factor, orig = r->original_max_position_embeddings;
    double beta_fast = r->beta_fast > 0 ? r->beta_fast : 32.0, beta_slow = r->beta_slow > 0 ? r->beta_slow : 1.0;
    if (r->attention_factor > 0) *scale = r->attention_factor;
    else if (r->mscale > 0 && r->mscale_all_dim > 0)
        *scale = (float)(yarn_mscale(factor, r->mscale) / yarn_mscale(factor, r->mscale_all_dim));
    else *scale = (float)yarn_mscale(factor, 1.0);
    double low = yarn_correction_dim(beta_fast, dim, theta, orig), high = yarn_correction_dim(beta_slow, dim, theta, orig);
    if (r->truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0) low = 0;
    if (high > dim - 1) high = dim - 1;
    if (low == high) high += 0.001;
    for (int i = 0; i < dim / 2; i++) {
        // transformers builds pos_freqs = theta^(2i/dim) in float32 and ramps in float32
        float pos_freq = powf((float)theta, (float)(2 * i) / (float)dim);
        float extra = 1.0f / pos_freq, inter = 1.0f / ((float)factor * pos_freq);
        float ramp = (float)(((double)i - low) / (high - low));
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        float extra_w = 1.0f - ramp;
        inv_freq[i] = inter * (1.0f - extra_w) + extra * extra_w;
    }
}

void sl_rope_inv_freq(const sl_model_config *c, int seq_len, float *inv_freq, float *scale) {
    const sl_rope_config *r = &c->rope;
    int dim = sl_config_head_dim(c), half = dim / 2;
    float theta = r->theta;
    *scale = 1.0f;
    if (r->type == SL_ROPE_YARN) {
        yarn(r, dim, inv_freq, scale);
        return;
    }
    if (r->type == SL_ROPE_DYNAMIC && seq_len > c->max_seq_len) {  // at or below max positions: theta as is
        double max_pos = c->max_seq_len;
        theta = (float)(r->theta * pow(r->factor * seq_len / max_pos - (r->factor - 1.0), (double)dim / (dim - 2)));
    }
    for (int i = 0; i < half; i++) {
        float f = default_inv_freq(theta, i, dim);
        if (r->type == SL_ROPE_LINEAR) f /= r->factor;
        else if (r->type == SL_ROPE_LLAMA3) f = llama3(r, f);
        inv_freq[i] = f;
    }
}

void sl_rope_fill(float *cos_t, float *sin_t, int pos0, int n, int half, const float *inv_freq, float scale) {
    for (int t = 0; t < n; t++)
        for (int i = 0; i < half; i++) {
            float angle = (float)(pos0 + t) * inv_freq[i];  // float32, as transformers' inv_freq @ positions
            cos_t[(size_t)t * half + i] = cosf(angle) * scale;
            sin_t[(size_t)t * half + i] = sinf(angle) * scale;
        }
}

int sl_rope_tables(float *cos_t, float *sin_t, int max_T, int HD, float theta) {
    float *inv_freq = malloc(sizeof(float) * (size_t)(HD / 2 > 0 ? HD / 2 : 1));
    if (!inv_freq) return -1;
    for (int i = 0; i < HD / 2; i++) inv_freq[i] = default_inv_freq(theta, i, HD);
    sl_rope_fill(cos_t, sin_t, 0, max_T, HD / 2, inv_freq, 1.0f);
    free(inv_freq);
    return 0;
}

int sl_rope_depends_on_length(const sl_model_config *c) {
    return c->arch == SL_ARCH_LLAMA && c->rope.type == SL_ROPE_DYNAMIC;
}
