// ddp.h: data-parallel gradient averaging, as PyTorch DDP does it. The flat gradient buffer is cut
// into contiguous buckets in reverse layer order (the order backward finishes them): a small first
// bucket at the end of the buffer, then buckets of reduce_bucket_size elements. The model's unit
// hook tells the engine how far backward has got, and every bucket entirely above that watermark
// starts a non-blocking all-reduce at once, so communication overlaps the rest of backward.
// sl_ddp_finish starts what is left, waits for everything and divides by the data-parallel size.
//
// The gradients live where the model's ops table keeps tensors (GPU memory under cuda): DDP touches
// them only through the group's collectives and ops->scale. Before each bucket's all-reduce the
// group is ordered after the ops' stream (sl_comm_order_after), so NCCL reduces a bucket once the
// kernels that wrote it have run while the host goes on queueing the rest of backward.
#ifndef SHARDLM_DDP_H
#define SHARDLM_DDP_H

#include <stddef.h>
#include "shardlm/comm.h"
#include "shardlm/ops.h"

typedef struct {
    size_t begin, end;       // [begin, end) of the flat gradient buffer
    sl_comm_request req;
    int started;
} sl_ddp_bucket;

typedef struct {
    sl_comm *dp;
    const sl_ops *ops;       // the backend holding `grads`
    float *grads;            // (total) in the backend's memory
    size_t total;
    sl_ddp_bucket *buckets;  // buckets[0] ends at `total`; each next one lies just below
    int n_buckets;
    int next;                // first bucket not yet started
    int overlap;             // 0: every all-reduce waits for sl_ddp_finish (for measurement)
} sl_ddp;

// bucket_size and first_bucket_size are in elements (DeepSpeed's reduce_bucket_size unit).
int sl_ddp_init(sl_ddp *d, sl_comm *dp, const sl_ops *ops, float *grads, size_t total, size_t bucket_size,
                size_t first_bucket_size, int overlap);
void sl_ddp_free(sl_ddp *d);

// Called as backward finishes gradients (everything at flat offsets >= ready_from is final):
// starts every bucket with begin >= ready_from, and lets pending ones progress.
int sl_ddp_grad_ready(sl_ddp *d, size_t ready_from);

// Starts the remaining buckets, waits for all, and scales the gradients by 1/dp size.
int sl_ddp_finish(sl_ddp *d);

#endif
