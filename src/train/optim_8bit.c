// optim_8bit.c: 8-bit AdamW's plan (which tensor parts of a flat range get 8-bit blockwise or 32-bit
// state, and where), its state buffers, its step scalars, and the step with the ZeRO exchange of cut
// blocks' absmax (optim_8bit.h). The arithmetic is the backend's (ops->adam8_step).
#include "shardlm/optim_8bit.h"
#include "shardlm/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }
static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

void sl_adam8_plan_free(sl_adam8_plan *plan) {
    free(plan->segs);
    free(plan->seg_tensor);
    free(plan->seg_block0);
    memset(plan, 0, sizeof *plan);
}

int sl_adam8_plan_build(sl_adam8_plan *plan, const sl_tensor_info *tensors, int n_tensors, size_t total,
                        const sl_optim_config *cfg, size_t begin, size_t end) {
    memset(plan, 0, sizeof *plan);
    end = min_sz(end, total);
    begin = min_sz(begin, end);
    plan->begin = begin;
    plan->end = end;
    size_t cap = (size_t)(n_tensors > 0 ? n_tensors : 1);
    plan->segs = sl_calloc(cap, sizeof *plan->segs, "8-bit optimizer plan");
    plan->seg_tensor = sl_calloc(cap, sizeof *plan->seg_tensor, "8-bit optimizer plan");
    plan->seg_block0 = sl_calloc(cap, sizeof *plan->seg_block0, "8-bit optimizer plan");
    if (!plan->segs || !plan->seg_tensor || !plan->seg_block0) {
        sl_adam8_plan_free(plan);
        return -1;
    }
    const size_t B = SL_ADAM8_BLOCK;
    for (int i = 0; i < n_tensors; i++) {
        const sl_tensor_info *t = &tensors[i];
        size_t lo = max_sz(begin, t->offset), hi = min_sz(end, t->offset + t->numel);
        if (lo >= hi) continue;
        int k = plan->n_segs++;
        sl_adam8_segment *s = &plan->segs[k];
        s->begin = lo - begin;
        s->end = hi - begin;
        s->decay = cfg->weight_decay > 0.0 && (cfg->decay_all || t->weight_decay);
        s->quantized = (long long)t->numel >= cfg->min_8bit_size;
        plan->seg_tensor[k] = i;
        if (!s->quantized) {
            s->state = plan->n32;
            plan->n32 += hi - lo;
            continue;
        }
        size_t first = lo - t->offset, last = hi - 1 - t->offset;  // tensor-relative
        s->state = plan->n8;
        plan->n8 += hi - lo;
        s->block = plan->n_blocks;
        s->phase = (int)(first % B);
        plan->seg_block0[k] = first / B;
        plan->n_blocks += last / B - first / B + 1;
        s->cut_head = s->phase != 0;
        s->cut_tail = hi < t->offset + t->numel && (hi - t->offset) % B != 0;
        if (s->cut_head) plan->has_head = 1, plan->head_block = t->offset + first / B * B;
        if (s->cut_tail) plan->has_tail = 1, plan->tail_block = t->offset + last / B * B;
    }
    return 0;
}

size_t sl_adam8_state_bytes(const sl_adam8_plan *plan) {
    return 2 * plan->n8 + 2 * sizeof(float) * plan->n_blocks + 2 * sizeof(float) * plan->n32;
}

void sl_adam8_state_free(sl_adam8_state *st) {
    free(st->q1);
    free(st->q2);
    free(st->absmax1);
    free(st->absmax2);
    free(st->m32);
    free(st->v32);
    memset(st, 0, sizeof *st);
}

int sl_adam8_state_alloc(sl_adam8_state *st, const sl_adam8_plan *plan) {
    memset(st, 0, sizeof *st);
    // one byte more than needed, so an empty part still has a non-NULL buffer
    st->q1 = sl_calloc(plan->n8 + 1, 1, "8-bit optimizer state (exp_avg)");
    st->q2 = sl_calloc(plan->n8 + 1, 1, "8-bit optimizer state (exp_avg_sq)");
    st->absmax1 = sl_calloc(plan->n_blocks + 1, sizeof(float), "8-bit optimizer block absmax");
    st->absmax2 = sl_calloc(plan->n_blocks + 1, sizeof(float), "8-bit optimizer block absmax");
    st->m32 = sl_calloc(plan->n32 + 1, sizeof(float), "32-bit optimizer state of small tensors");
    st->v32 = sl_calloc(plan->n32 + 1, sizeof(float), "32-bit optimizer state of small tensors");
    if (st->q1 && st->q2 && st->absmax1 && st->absmax2 && st->m32 && st->v32) return 0;
    sl_adam8_state_free(st);
    return -1;
}

int sl_adam8_overlap(const sl_adam8_plan *dst, const sl_adam8_plan *src, sl_adam8_run_fn fn, void *ctx) {
    const size_t B = SL_ADAM8_BLOCK;
    for (int i = 0, j = 0; i < dst->n_segs && j < src->n_segs;) {
        if (dst->seg_tensor[i] != src->seg_tensor[j]) {
            if (dst->seg_tensor[i] < src->seg_tensor[j]) i++;
            else j++;
            continue;
        }
        const sl_adam8_segment *a = &dst->segs[i], *b = &src->segs[j];
        if (a->quantized != b->quantized)
            return sl_errorf("8-bit optimizer state: layout tensor %d has %s state on one side and %s on the other "
                             "(a different min_8bit_size?)", dst->seg_tensor[i], a->quantized ? "8-bit" : "32-bit",
                             b->quantized ? "8-bit" : "32-bit");
        size_t a_lo = dst->begin + a->begin, b_lo = src->begin + b->begin;
        size_t lo = max_sz(a_lo, b_lo), hi = min_sz(dst->begin + a->end, src->begin + b->end);
        if (lo < hi) {
            sl_adam8_part part = a->quantized ? SL_ADAM8_CODES : SL_ADAM8_FLOATS;
            if (fn(ctx, part, b->state + (lo - b_lo), a->state + (lo - a_lo), hi - lo)) return -1;
            if (a->quantized) {
                size_t tensor0 = a_lo - (dst->seg_block0[i] * B + (size_t)a->phase);  // the tensor's offset
                size_t k_lo = (lo - tensor0) / B, k_hi = (hi - 1 - tensor0) / B;
                if (fn(ctx, SL_ADAM8_ABSMAX, b->block + (k_lo - src->seg_block0[j]), a->block + (k_lo - dst->seg_block0[i]),
                       k_hi - k_lo + 1))
                    return -1;
            }
        }
        i++;
        j++;
    }
    return 0;
}

void sl_adam8_args_make(const sl_optim_config *cfg, double lr, int64_t step, sl_adam8_args *a) {
    double b1 = cfg->beta1, b2 = cfg->beta2, wd = cfg->weight_decay;
    double c1 = 1.0 - pow(b1, (double)step);        // correction1
    double c2 = sqrt(1.0 - pow(b2, (double)step));  // correction2
    *a = (sl_adam8_args){
        .beta1 = (float)b1, .one_minus_beta1 = (float)(1.0 - b1),
        .beta2 = (float)b2, .one_minus_beta2 = (float)(1.0 - b2),
        .bc2_sqrt = (float)c2, .eps = (float)cfg->eps, .neg_step = (float)(-lr / c1),
        .eps32 = (float)(cfg->eps * c2), .neg_step32 = (float)(-lr * c2 / c1),
        .decay_factor = wd > 0.0 ? (float)(1.0 - lr * wd) : 1.0f,
    };
}

void sl_adam8_edges_record(const sl_adam8_plan *plan, const sl_adam8_edges *measured, double record[6]) {
    record[0] = plan->has_head ? (double)plan->head_block : -1.0;
    record[1] = measured->head[0];
    record[2] = measured->head[1];
    record[3] = plan->has_tail ? (double)plan->tail_block : -1.0;
    record[4] = measured->tail[0];
    record[5] = measured->tail[1];
}

void sl_adam8_edges_combine(const sl_adam8_plan *plan, const double *records, int n_ranks, sl_adam8_edges *edges) {
    *edges = (sl_adam8_edges){{0, 0}, {0, 0}};
    for (int r = 0; r < n_ranks * 2; r++) {
        const double *x = records + 3 * r;
        if (x[0] < 0.0) continue;
        float *into[2] = {plan->has_head && x[0] == (double)plan->head_block ? edges->head : NULL,
                          plan->has_tail && x[0] == (double)plan->tail_block ? edges->tail : NULL};
        for (int k = 0; k < 2; k++)
            if (into[k]) {
                into[k][0] = fmaxf(into[k][0], (float)x[1]);
                into[k][1] = fmaxf(into[k][1], (float)x[2]);
            }
    }
}

// The cut blocks' absmax of this step's new state over the whole blocks: each rank measures its part,
// all-gathers the records, and takes the maximum per block.
static int exchange_edges(const sl_ops *ops, const sl_adam8_args *a, const sl_adam8_plan *plan, sl_adam8_state *st,
                          float *params, const float *grads, sl_comm *group, sl_adam8_edges *edges) {
    sl_adam8_edges mine = {{0, 0}, {0, 0}};
    if (plan->has_head || plan->has_tail) ops->adam8_step(a, params, grads, st, plan->segs, plan->n_segs, &mine, 1);
    double record[6];
    sl_adam8_edges_record(plan, &mine, record);
    int world = sl_comm_size(group);
    double *all = sl_malloc((size_t)world * 6 * sizeof(double), "8-bit optimizer block exchange");
    if (!all) return -1;
    int rc = sl_comm_allgather(group, record, all, 6, SL_DTYPE_F64);
    if (rc == 0) sl_adam8_edges_combine(plan, all, world, edges);
    free(all);
    return rc;
}

int sl_adam8_step(const sl_ops *ops, const sl_optim_config *cfg, const sl_adam8_plan *plan, sl_adam8_state *st,
                  double lr, int64_t step, float *params, const float *grads, sl_comm *group) {
    if (!ops->adam8_step)
        return sl_errorf("optimizer AdamW8bit has no kernel on the %s backend (it runs on the CPU: --device cpu)",
                         ops->name);
    if (step < 1) return sl_errorf("optimizer step number must start at 1, got %lld", (long long)step);
    sl_adam8_args a;
    sl_adam8_args_make(cfg, lr, step, &a);
    sl_adam8_edges edges = {{0, 0}, {0, 0}};
    if (group && sl_comm_size(group) > 1 && exchange_edges(ops, &a, plan, st, params, grads, group, &edges))
        return sl_error_context("AdamW8bit: exchanging the absmax of blocks cut by the ZeRO shards");
    ops->adam8_step(&a, params, grads, st, plan->segs, plan->n_segs, &edges, 0);
    return 0;
}
