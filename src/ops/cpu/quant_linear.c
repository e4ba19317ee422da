// quant_linear.c: the quantised linear's forward and input gradient, a tile of weight rows at a time
// (see quant_linear.h).
#include "shardlm/quant_linear.h"
#include "shardlm/error.h"
#include "ops/cpu/cpu_ops.h"

#include <stdlib.h>
#include <string.h>

int sl_qlinear_init(sl_qlinear *l, int n, const sl_qtensor *const *parts, const char *what) {
    memset(l, 0, sizeof *l);
    if (n < 1 || n > SL_QLINEAR_MAX_PARTS)
        return sl_errorf("%s: %d quantised parts (expected 1 to %d)", what, n, SL_QLINEAR_MAX_PARTS);
    for (int i = 0; i < n; i++) {
        if (sl_qtensor_validate(parts[i], what)) return -1;
        if (parts[i]->cols != parts[0]->cols)
            return sl_errorf("%s: part %d has %lld input features, part 0 has %lld", what, i,
                             (long long)parts[i]->cols, (long long)parts[0]->cols);
        l->part[i] = parts[i];
        l->out_features += parts[i]->rows;
    }
    l->n_parts = n;
    l->in_features = parts[0]->cols;
    return 0;
}

// Rows per tile: as many whole rows as fit the buffer (at least one).
int64_t sl_qlinear_tile_rows(const sl_qlinear *l) {
    size_t cap = l->tile_floats ? l->tile_floats : SL_QLINEAR_TILE_FLOATS;
    int64_t r = (int64_t)(cap / (size_t)l->in_features);
    return r < 1 ? 1 : r;
}

size_t sl_qlinear_tile_floats(const sl_qlinear *l) { return (size_t)sl_qlinear_tile_rows(l) * (size_t)l->in_features; }

// The tile buffer: the caller's scratch, or a new one (freed by release_tile).
static float *get_tile(const sl_qlinear *l) {
    return l->scratch ? l->scratch : sl_malloc(sl_qlinear_tile_floats(l) * sizeof(float), "quantised linear tile");
}
static void release_tile(const sl_qlinear *l, float *tile) { if (tile != l->scratch) free(tile); }

// Dequantises rows [r0, r0 + nr) of q into tile (nr x IC), rows split over the threads.
void sl_qlinear_dequant_rows(const sl_qtensor *q, int64_t r0, int64_t nr, float *tile) {
    const size_t ic = (size_t)q->cols;
#pragma omp parallel for schedule(static) if ((size_t)nr * ic >= SL_PAR_MIN_WORK)
    for (int64_t r = 0; r < nr; r++) sl_dequantize_range(q, (size_t)(r0 + r) * ic, ic, tile + (size_t)r * ic);
}

int sl_qlinear_forward(const sl_qlinear *l, float *out, const float *inp, const float *bias, int N) {
    const int64_t tr = sl_qlinear_tile_rows(l);
    float *tile = get_tile(l);
    if (!tile) return -1;
    const int64_t OC = l->out_features, IC = l->in_features;
    float beta = 0.0f;
    if (bias) {
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * (size_t)OC, bias, sizeof(float) * (size_t)OC);
        beta = 1.0f;
    }
    int64_t o = 0;   // the first output feature of the current part
    for (int p = 0; p < l->n_parts; p++) {
        const sl_qtensor *q = l->part[p];
        for (int64_t r0 = 0; r0 < q->rows; r0 += tr) {
            int64_t nr = q->rows - r0 < tr ? q->rows - r0 : tr;
            sl_qlinear_dequant_rows(q, r0, nr, tile);
            // out[:, o + r0 : o + r0 + nr] (N, nr) = inp (N, IC) @ tile^T
            cpu_sgemm(0, 1, N, (int)nr, (int)IC, 1.0f, inp, (int)IC, tile, (int)IC, beta, out + o + r0, (int)OC);
        }
        o += q->rows;
    }
    release_tile(l, tile);
    return 0;
}

int sl_qlinear_backward_input(const sl_qlinear *l, float *dinp, const float *dout, int N, int accumulate) {
    const int64_t tr = sl_qlinear_tile_rows(l);
    float *tile = get_tile(l);
    if (!tile) return -1;
    const int64_t OC = l->out_features, IC = l->in_features;
    float beta = accumulate ? 1.0f : 0.0f;
    int64_t o = 0;
    for (int p = 0; p < l->n_parts; p++) {
        const sl_qtensor *q = l->part[p];
        for (int64_t r0 = 0; r0 < q->rows; r0 += tr) {
            int64_t nr = q->rows - r0 < tr ? q->rows - r0 : tr;
            sl_qlinear_dequant_rows(q, r0, nr, tile);
            // dinp (N, IC) (+)= dout[:, o + r0 : o + r0 + nr] (N, nr) @ tile (nr, IC)
            cpu_sgemm(0, 0, N, (int)IC, (int)nr, 1.0f, dout + o + r0, (int)OC, tile, (int)IC, beta, dinp, (int)IC);
            beta = 1.0f;
        }
        o += q->rows;
    }
    release_tile(l, tile);
    return 0;
}
