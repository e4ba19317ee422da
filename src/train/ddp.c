// ddp.c: bucketed, overlapped gradient all-reduce (see ddp.h). Invariants: buckets [0, next) have
// been started and nothing writes their range again during this backward; a bucket's all-reduce is
// queued behind the ops' stream (sl_comm_order_after), so it reads what backward wrote; nothing else
// reads or scales the gradients before sl_ddp_finish has waited for every bucket.
#include "shardlm/ddp.h"
#include "shardlm/error.h"

#include <stdlib.h>
#include <string.h>

int sl_ddp_init(sl_ddp *d, sl_comm *dp, const sl_ops *ops, float *grads, size_t total, size_t bucket_size,
                size_t first_bucket_size, int overlap) {
    memset(d, 0, sizeof *d);
    if (bucket_size == 0) return sl_errorf("ddp: reduce_bucket_size must be positive");
    if (first_bucket_size == 0 || first_bucket_size > bucket_size) first_bucket_size = bucket_size;
    size_t n = 1 + (total > first_bucket_size ? (total - first_bucket_size + bucket_size - 1) / bucket_size : 0);
    d->buckets = sl_calloc(n, sizeof *d->buckets, "ddp buckets");
    if (!d->buckets) return -1;
    size_t end = total;
    for (size_t i = 0; i < n && end > 0; i++) {
        size_t size = i == 0 ? first_bucket_size : bucket_size;
        d->buckets[i].end = end;
        d->buckets[i].begin = end > size ? end - size : 0;
        end = d->buckets[i].begin;
        d->n_buckets++;
    }
    d->dp = dp;
    d->ops = ops;
    d->grads = grads;
    d->total = total;
    d->overlap = overlap;
    return 0;
}

void sl_ddp_free(sl_ddp *d) {
    free(d->buckets);
    memset(d, 0, sizeof *d);
}

// The bucket's gradients were written by kernels queued on the ops' stream: the all-reduce waits for
// them on the GPU, not the host.
static int start_bucket(sl_ddp *d, sl_ddp_bucket *b) {
    if (sl_comm_order_after(d->dp, d->ops->stream())) return -1;
    b->started = 1;
    return sl_comm_iallreduce(d->dp, d->grads + b->begin, b->end - b->begin, SL_DTYPE_F32, SL_OP_SUM, &b->req);
}

int sl_ddp_grad_ready(sl_ddp *d, size_t ready_from) {
    if (!d->overlap) return 0;
    while (d->next < d->n_buckets && d->buckets[d->next].begin >= ready_from) {
        if (start_bucket(d, &d->buckets[d->next])) return sl_error_context("ddp: starting a gradient all-reduce");
        d->next++;
    }
    // give the started operations a chance to progress while backward computes
    for (int i = 0; i < d->next; i++) {
        int done;
        if (!d->buckets[i].req.done && sl_comm_test(&d->buckets[i].req, &done)) return -1;
    }
    return 0;
}

int sl_ddp_finish(sl_ddp *d) {
    for (; d->next < d->n_buckets; d->next++)
        if (start_bucket(d, &d->buckets[d->next])) return -1;
    int rc = 0;
    for (int i = 0; i < d->n_buckets; i++) {
        if (d->buckets[i].started && sl_comm_wait(&d->buckets[i].req)) rc = -1;
        d->buckets[i].started = 0;
    }
    d->next = 0;
    if (rc) return rc;
    d->ops->scale(d->grads, d->total, 1.0f / (float)sl_comm_size(d->dp));
    return 0;
}
