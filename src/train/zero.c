// zero.c: ZeRO stages 1-3 (see zero.h). Invariants:
// - rank r owns [r*S, (r+1)*S) of the flat buffer; a unit's part on each rank is the intersection
//   of the unit with that slice, so the parts of a unit tile it in rank order (the layout the
//   variable-count collectives expect);
// - a parameter window holding unit u (unit == u) holds u's current parameters once its gather has
//   completed; the optimizer step drops every window (unit = -1);
// - a gradient window is reused only after its reduction completed; sl_zero_finish_backward leaves
//   no reduction in flight, so shard_grads is stable between backwards;
// - before the optimizer changes shard_params, no gather that reads it is in flight;
// - every buffer here (shards, windows, the model's params / grads) is the backend's memory, touched
//   only through the model's ops table and the group's collectives; each collective on them is queued
//   behind the ops' stream first (ordered()), so it reads what kernels wrote and overwrites a window
//   only after the kernels that read it; the host waits for a collective before ops use its result.
#include "shardlm/zero.h"
#include "shardlm/error.h"
#include "shardlm/lora.h"

#include <stdlib.h>
#include <string.h>

static int last_unit(const sl_zero *z) { return z->buf.n_units - 1; }
static size_t unit_begin(const sl_zero *z, int u) { return z->buf.unit_begin[u]; }
static size_t unit_size(const sl_zero *z, int u) { return z->buf.unit_begin[u + 1] - z->buf.unit_begin[u]; }
static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }
static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }
static const sl_ops *ops_of(const sl_zero *z) { return z->model->ops; }

// The group's next collective starts after the work queued so far on the ops' stream (GPU side).
static int ordered(sl_zero *z) { return sl_comm_order_after(z->dp, ops_of(z)->stream()); }

// This rank's part [lo, hi) of unit u (empty when lo == hi).
static void owned_part(const sl_zero *z, int u, size_t *lo, size_t *hi) {
    size_t ub = unit_begin(z, u), ue = ub + unit_size(z, u);
    *lo = max_sz(ub, z->shard_begin);
    *hi = min_sz(ue, z->shard_begin + z->shard_size);
    if (*hi < *lo) *hi = *lo;
}

// Every rank's part of unit u: counts and offsets within the unit.
static void unit_counts(sl_zero *z, int u) {
    size_t ub = unit_begin(z, u), ue = ub + unit_size(z, u);
    for (int r = 0; r < z->world; r++) {
        size_t lo = max_sz(ub, (size_t)r * z->shard_size), hi = min_sz(ue, (size_t)(r + 1) * z->shard_size);
        z->counts[r] = hi > lo ? hi - lo : 0;
        z->displs[r] = min_sz(lo, ue) - ub;
    }
}

static int wait_window(sl_zero_window *w) {
    if (!w->pending) return 0;
    w->pending = 0;
    return sl_comm_wait(&w->req);
}

// The window for unit u: the fixed one of an edge unit, else the block window holding u, else the
// block window not in use (the least recently used when neither is). NULL when both are in use.
static sl_zero_window *pick(sl_zero *z, sl_zero_window *w, int u) {
    if (u == 0) return &w[0];
    if (u == last_unit(z)) return &w[1];
    if (w[2].unit == u) return &w[2];
    if (w[3].unit == u) return &w[3];
    if (w[2].busy && w[3].busy) return NULL;
    if (w[2].busy) return &w[3];
    if (w[3].busy) return &w[2];
    return w[2].stamp <= w[3].stamp ? &w[2] : &w[3];
}

static sl_zero_window *held(sl_zero_window *w, int u) {
    for (int i = 0; i < 4; i++)
        if (w[i].unit == u && w[i].busy) return &w[i];
    return NULL;
}

// Starts gathering unit u of the slice-shaped buffer `src` (the parameters unless a checkpoint asks
// for the master weights) into w (after whatever w was doing).
static int start_gather_from(sl_zero *z, const float *src, sl_zero_window *w, int u) {
    if (wait_window(w)) return -1;
    size_t lo, hi;
    owned_part(z, u, &lo, &hi);
    unit_counts(z, u);
    const float *send = hi > lo ? src + (lo - z->shard_begin) : src;
    w->unit = u;
    w->bf16_unit = -1;
    w->pending = 1;
    w->stamp = ++z->clock;
    if (ordered(z) || sl_comm_iallgatherv(z->dp, send, w->data, z->counts, z->displs, SL_DTYPE_F32, &w->req)) {
        w->pending = 0;
        w->unit = -1;
        return sl_error_context("ZeRO-3: gathering the parameters of unit %d", u);
    }
    return 0;
}

static int start_gather(sl_zero *z, sl_zero_window *w, int u) { return start_gather_from(z, z->shard_params, w, u); }

// Starts reducing unit u's gradients in src into their owners' shard_grads; with earlier
// micro-batches accumulated, the owner first adds its running sum into its part of src (the ops'
// fp32 add pass, in place), so the sum over micro-batches and ranks happens
// inside the collective and shard_grads is simply overwritten by it.
static int start_reduce(sl_zero *z, float *src, int u, sl_comm_request *req) {
    size_t lo, hi, ub = unit_begin(z, u);
    owned_part(z, u, &lo, &hi);
    unit_counts(z, u);
    float *recv = hi > lo ? z->shard_grads + (lo - z->shard_begin) : z->shard_grads;
    if (z->accumulated && hi > lo) {
        float *dst = src + (lo - ub);
        ops_of(z)->add(dst, recv, hi - lo);
    }
    if (ordered(z) || sl_comm_ireduce_scatterv(z->dp, src, recv, z->counts, SL_DTYPE_F32, SL_OP_SUM, req))
        return sl_error_context("ZeRO-%d: reducing the gradients of unit %d", z->stage, u);
    return 0;
}

// Lets every operation in flight progress (MPI moves non-blocking collectives inside its calls).
static int progress(sl_zero *z) {
    for (int k = 0; k < 2; k++) {
        sl_zero_window *w = k == 0 ? z->pwin : z->gwin;
        for (int i = 0; i < 4; i++) {
            int done = 0;
            if (w[i].pending && sl_comm_test(&w[i].req, &done)) return -1;
            if (w[i].pending && done) w[i].pending = 0;
        }
    }
    for (int u = 0; z->unit_req && u < z->buf.n_units; u++) {
        int done;
        if (z->unit_req[u].impl && sl_comm_test(&z->unit_req[u], &done)) return -1;
    }
    return 0;
}

static int params_get(sl_zero *z, int u, int next) {
    sl_zero_window *w = pick(z, z->pwin, u);
    if (!w) return sl_errorf("ZeRO-3: unit %d needs a parameter window but both block windows are in use", u);
    if (w->unit != u && start_gather(z, w, u)) return -1;
    if (wait_window(w)) return sl_error_context("ZeRO-3: gathering the parameters of unit %d", u);
    w->busy = 1;
    w->stamp = ++z->clock;
    z->buf.param_view[u] = w->data;
    if (w->data_bf16) {  // bf16 activation storage: the GEMMs read the window's bf16 copy
        if (w->bf16_unit != u) ops_of(z)->to_storage(w->data_bf16, w->data, unit_size(z, u));
        w->bf16_unit = u;
        z->buf.weight_view[u] = w->data_bf16;
    }
    if (z->prefetch && next >= 0 && next != u) {
        sl_zero_window *p = pick(z, z->pwin, next);
        if (p && !p->busy && p->unit != next && start_gather(z, p, next)) return -1;
    }
    return 0;
}

static int grads_get(sl_zero *z, int u) {
    sl_zero_window *w = pick(z, z->gwin, u);
    if (!w || w->busy) return sl_errorf("ZeRO-%d: unit %d needs a gradient window but none is free", z->stage, u);
    if (wait_window(w)) return sl_error_context("ZeRO-%d: reducing gradients", z->stage);
    ops_of(z)->memzero(w->data, unit_size(z, u) * sizeof(float));
    w->unit = u;
    w->busy = 1;
    w->stamp = ++z->clock;
    z->buf.grad_view[u] = w->data;
    return 0;
}

static int grads_put(sl_zero *z, int u) {
    if (z->stage == 1) {
        if (!z->reducing) return 0;
        return start_reduce(z, *z->buf.grads + unit_begin(z, u), u, &z->unit_req[u]);
    }
    sl_zero_window *w = held(z->gwin, u);
    if (!w) return sl_errorf("ZeRO-%d: gradients of unit %d finished but were never opened", z->stage, u);
    w->busy = 0;
    z->buf.grad_view[u] = NULL;
    w->pending = 1;
    return start_reduce(z, w->data, u, &w->req);
}

int sl_zero_hook(void *ctx, sl_unit_event event, int unit, int next_unit) {
    sl_zero *z = ctx;
    int rc = 0;
    switch (event) {
    case SL_PARAMS_GET:
        if (z->stage == 3) rc = params_get(z, unit, next_unit);
        break;
    case SL_PARAMS_PUT:
        if (z->stage == 3) {
            sl_zero_window *w = held(z->pwin, unit);
            if (w) w->busy = 0;
            z->buf.param_view[unit] = NULL;
            z->buf.weight_view[unit] = NULL;
        }
        break;
    case SL_GRADS_GET:
        if (z->stage >= 2) rc = grads_get(z, unit);
        break;
    case SL_GRADS_PUT:
        rc = grads_put(z, unit);
        break;
    }
    return rc ? rc : progress(z);
}

void sl_zero_begin_backward(sl_zero *z, int last_micro) { z->reducing = z->stage >= 2 || last_micro; }

int sl_zero_finish_backward(sl_zero *z) {
    int rc = 0;
    for (int u = 0; z->unit_req && u < z->buf.n_units; u++)
        if (z->unit_req[u].impl && sl_comm_wait(&z->unit_req[u])) rc = -1;
    for (int i = 0; i < 4; i++) {
        if (wait_window(&z->gwin[i])) rc = -1;
        if (z->gwin[i].busy) rc = sl_errorf("ZeRO-%d: backward left the gradients of unit %d open", z->stage, z->gwin[i].unit);
    }
    if (rc == 0 && z->reducing && z->stage >= 2) z->accumulated = 1;
    return rc;
}

float *sl_zero_step_params(sl_zero *z) { return z->stage == 3 ? z->shard_params : *z->buf.params + z->shard_begin; }

int sl_zero_before_step(sl_zero *z) {
    int rc = 0;
    for (int i = 0; i < 4; i++)
        if (wait_window(&z->pwin[i])) rc = -1;
    return rc;
}

void sl_zero_zero_grads(sl_zero *z) {
    ops_of(z)->memzero(z->shard_grads, z->shard_size * sizeof(float));
    if (z->stage == 1) ops_of(z)->memzero(*z->buf.grads, *z->buf.capacity * sizeof(float));
    z->accumulated = 0;
}

int sl_zero_after_step(sl_zero *z) {
    sl_zero_zero_grads(z);
    if (z->stage == 3) {
        for (int i = 0; i < 4; i++) z->pwin[i].unit = z->pwin[i].bf16_unit = -1;
        return 0;
    }
    float *p = *z->buf.params;
    if (ordered(z) || sl_comm_allgather(z->dp, p + z->shard_begin, p, z->shard_size, SL_DTYPE_F32))
        return sl_error_context("ZeRO-%d: gathering the updated parameters", z->stage);
    return 0;
}

int sl_zero_gather_slices(sl_zero *z, const float *slice, float *full) {
    if (sl_zero_before_step(z)) return -1;
    int params = slice == z->shard_params;
    for (int u = 0; u < z->buf.n_units; u++) {
        sl_zero_window *w = pick(z, z->pwin, u);
        if (!w || w->busy) return sl_errorf("ZeRO-3: cannot gather the parameters while the model uses them");
        if ((!params || w->unit != u) && start_gather_from(z, slice, w, u)) return -1;
        if (wait_window(w)) return -1;
        if (full) ops_of(z)->download(full + unit_begin(z, u), w->data, unit_size(z, u) * sizeof(float));
        if (!params) w->unit = w->bf16_unit = -1;  // the window holds something other than the parameters now
    }
    return 0;
}

int sl_zero_gather_params(sl_zero *z, float *full) { return sl_zero_gather_slices(z, z->shard_params, full); }

int sl_zero_scatter_params(sl_zero *z, const float *full, int root) {
    if (sl_zero_before_step(z)) return -1;
    for (int u = 0; u < z->buf.n_units; u++) {
        sl_zero_window *w = pick(z, z->pwin, u);
        if (!w || w->busy) return sl_errorf("ZeRO-3: cannot load parameters while the model uses them");
        size_t n = unit_size(z, u), lo, hi;
        w->unit = w->bf16_unit = -1;
        if (z->rank == root) ops_of(z)->upload(w->data, full + unit_begin(z, u), n * sizeof(float));
        if (ordered(z) || sl_comm_broadcast(z->dp, w->data, n, SL_DTYPE_F32, root)) return -1;
        owned_part(z, u, &lo, &hi);
        if (hi > lo)
            ops_of(z)->copy(z->shard_params + (lo - z->shard_begin), w->data + (lo - unit_begin(z, u)),
                            (hi - lo) * sizeof(float));
    }
    return 0;
}

void sl_zero_memory(const sl_zero *z, size_t *param_bytes, size_t *grad_bytes) {
    const sl_zero_buffer *b = &z->buf;
    size_t p = (*b->params ? *b->capacity : 0) + (z->shard_params ? z->shard_size : 0);
    size_t g = (*b->grads ? *b->capacity : 0) + z->shard_size;
    for (int i = 0; i < 4; i++) {
        p += z->pwin[i].cap;
        g += z->gwin[i].cap;
    }
    *param_bytes = p * sizeof(float);
    *grad_bytes = g * sizeof(float);
}

static size_t largest_block(int n_units, const size_t *unit_begin) {
    size_t block = 0;
    for (int u = 1; u < n_units - 1; u++) block = max_sz(block, unit_begin[u + 1] - unit_begin[u]);
    return block;
}

size_t sl_zero_window_floats(int n_units, const size_t *unit_begin) {
    return unit_begin[1] - unit_begin[0] + unit_begin[n_units] - unit_begin[n_units - 1] +
           2 * largest_block(n_units, unit_begin);
}

sl_zero_estimate sl_zero_memory_estimate(int n_units, const size_t *unit_begin, int world, int stage,
                                         int optim_state_buffers) {
    static const char *const formula[4] = {"4P + 4P + KP", "4P + 4(P+S) + KS", "4P + 4(S+W) + KS",
                                           "4(S+W) + 4(S+W) + KS"};
    if (stage < 0 || stage > 3) stage = 0;
    if (world < 1) world = 1;
    size_t total = unit_begin[n_units];
    double P = (double)total, K = optim_state_buffers * 4.0;
    double S = stage == 0 ? P : (double)((total + (size_t)world - 1) / (size_t)world);
    double Pp = stage == 0 ? P : S * world, W = (double)sl_zero_window_floats(n_units, unit_begin);
    sl_zero_estimate e = {
        .params = stage == 3 ? 4 * (S + W) : 4 * Pp,
        .grads = stage == 0 ? 4 * P : stage == 1 ? 4 * (Pp + S) : 4 * (S + W),
        .optim = stage == 0 ? K * P : K * S,
        .P = P, .S = S, .W = stage >= 2 ? W : 0.0, .K = K, .formula = formula[stage],
    };
    return e;
}

// Windows sized for their role: unit 0, the last unit, and the largest block (twice); with_bf16:
// each with its bf16 copy too (parameter windows under bf16 activation storage).
static int alloc_windows(sl_zero *z, sl_zero_window *w, const char *what, int with_bf16) {
    size_t block = largest_block(z->buf.n_units, z->buf.unit_begin);
    size_t sizes[4] = {unit_size(z, 0), unit_size(z, last_unit(z)), block, block};
    for (int i = 0; i < 4; i++) {
        size_t n = sizes[i] ? sizes[i] : 1;
        w[i].data = ops_of(z)->alloc(n * sizeof(float), what);
        if (!w[i].data) return -1;
        if (with_bf16 && !(w[i].data_bf16 = ops_of(z)->alloc(n * sizeof(sl_bf16), what))) return -1;
        w[i].cap = sizes[i];
    }
    return 0;
}

sl_zero_buffer sl_zero_buffer_of(sl_model *m) {
    sl_lora *lo = m->lora;
    if (lo)
        return (sl_zero_buffer){lo->total, lo->n_units, lo->unit_begin, &lo->params, &lo->grads, &lo->capacity,
                                &lo->weights_bf16, lo->param_view, lo->grad_view, lo->weight_view};
    return (sl_zero_buffer){m->layout.total, m->layout.n_units, m->layout.unit_begin, &m->params, &m->grads,
                            &m->capacity, &m->weights_bf16, m->param_view, m->grad_view, m->weight_view};
}

// Points the owner's unit views into its full buffers (after they moved or went away).
static void bind_views(const sl_zero_buffer *b) {
    for (int u = 0; u < b->n_units; u++) {
        b->param_view[u] = *b->params ? *b->params + b->unit_begin[u] : NULL;
        b->grad_view[u] = *b->grads ? *b->grads + b->unit_begin[u] : NULL;
        b->weight_view[u] = *b->weights_bf16 ? *b->weights_bf16 + b->unit_begin[u] : NULL;
    }
}

// Stages 1-2: the owner's parameter and gradient buffers grown to n floats (the tail zero), so the
// parameter all-gather works in place.
static int grow(sl_zero *z, size_t n) {
    sl_zero_buffer *b = &z->buf;
    const sl_ops *ops = ops_of(z);
    if (n <= *b->capacity) return 0;
    float *p = ops->alloc(n * sizeof(float), "parameters");
    float *g = p ? ops->alloc(n * sizeof(float), "gradients") : NULL;
    if (!p || !g) {
        if (p) ops->dealloc(p);
        return sl_error_context("growing parameters and gradients to %zu floats", n);
    }
    ops->copy(p, *b->params, *b->capacity * sizeof(float));
    ops->copy(g, *b->grads, *b->capacity * sizeof(float));
    ops->dealloc(*b->params);
    ops->dealloc(*b->grads);
    *b->params = p;
    *b->grads = g;
    *b->capacity = n;
    return 0;
}

int sl_zero_init(sl_zero *z, sl_model *model, sl_comm *dp, int stage, int prefetch) {
    memset(z, 0, sizeof *z);
    for (int i = 0; i < 4; i++) z->pwin[i].unit = z->gwin[i].unit = z->pwin[i].bf16_unit = -1;
    if (stage < 1 || stage > 3) return sl_errorf("ZeRO: stage %d is not 1, 2 or 3", stage);
    if (!dp) return sl_errorf("ZeRO-%d needs a data-parallel group (the self group for one process)", stage);
    z->dp = dp;
    z->rank = sl_comm_rank(dp);
    z->world = sl_comm_size(dp);
    z->stage = stage;
    z->prefetch = prefetch;
    z->model = model;
    z->buf = sl_zero_buffer_of(model);
    sl_zero_buffer *b = &z->buf;
    const sl_ops *ops = model->ops;
    z->total = b->total;
    z->shard_size = (z->total + (size_t)z->world - 1) / (size_t)z->world;
    z->padded_total = z->shard_size * (size_t)z->world;
    z->shard_begin = z->shard_size * (size_t)z->rank;
    z->counts = sl_calloc((size_t)z->world, sizeof(size_t), "ZeRO counts");
    z->displs = sl_calloc((size_t)z->world, sizeof(size_t), "ZeRO counts");
    z->shard_grads = ops->alloc((z->shard_size ? z->shard_size : 1) * sizeof(float), "ZeRO gradient slice");
    if (!z->counts || !z->displs || !z->shard_grads) goto fail;
    if (stage <= 2 && grow(z, z->padded_total)) goto fail;
    if (stage == 1 && !(z->unit_req = sl_calloc((size_t)b->n_units, sizeof *z->unit_req, "ZeRO requests")))
        goto fail;
    if (stage >= 2) {
        if (alloc_windows(z, z->gwin, "ZeRO gradient windows", 0)) goto fail;
        ops->dealloc(*b->grads);
        *b->grads = NULL;
    }
    if (stage == 3) {
        z->shard_params = ops->alloc((z->shard_size ? z->shard_size : 1) * sizeof(float), "ZeRO-3 parameter slice");
        if (!z->shard_params || alloc_windows(z, z->pwin, "ZeRO-3 parameter windows", ops->act_bf16)) goto fail;
        size_t end = min_sz(z->shard_begin + z->shard_size, z->total);
        if (end > z->shard_begin)
            ops->copy(z->shard_params, *b->params + z->shard_begin, (end - z->shard_begin) * sizeof(float));
        ops->dealloc(*b->params);
        *b->params = NULL;
        if (*b->weights_bf16) ops->dealloc(*b->weights_bf16);  // the windows carry their own
        *b->weights_bf16 = NULL;
    }
    bind_views(b);
    return 0;
fail:
    sl_zero_free(z);
    return sl_error_context("setting up ZeRO stage %d", stage);
}

// Frees what this rank allocated (the model's own buffers are the model's).
void sl_zero_free(sl_zero *z) {
    if (z->model) {
        void (*dealloc)(void *) = ops_of(z)->dealloc;
        for (int i = 0; i < 4; i++) {
            if (z->pwin[i].data) dealloc(z->pwin[i].data);
            if (z->pwin[i].data_bf16) dealloc(z->pwin[i].data_bf16);
            if (z->gwin[i].data) dealloc(z->gwin[i].data);
        }
        if (z->shard_params) dealloc(z->shard_params);
        if (z->shard_grads) dealloc(z->shard_grads);
    }
    free(z->unit_req);
    free(z->counts);
    free(z->displs);
    memset(z, 0, sizeof *z);
}
