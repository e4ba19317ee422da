// zero.h: ZeRO stages 1-3 (DeepSpeed's semantics) over the flat layer-major buffers of layout.h.
//
// What is partitioned is the buffer the engine trains (sl_zero_buffer): the model's parameters, or,
// with LoRA adapters attached (lora.h), the adapters' flat buffer alone. The frozen base then stays
// whole on every rank, as DeepSpeed leaves parameters without requires_grad out of its partitions:
// stage 1 shards the adapters' optimizer state, 2 also their gradients, 3 also their parameters.
// Both buffers are cut into the same units, so the model's unit hook drives either.
//
// Partition: with N data-parallel ranks and S = ceil(total / N), rank r owns the slice
// [r*S, (r+1)*S) of the flat buffer padded to N*S (the padding is zero and never decays). Every rank
// holds the optimizer state of its slice only (1/N), and `shard_grads`: the reduced gradient sums of
// its slice for the current step.
//
// The model announces each unit (embeddings, each block, final norm + head) as it uses it
// (model.h unit hook); the engine hands every event to sl_zero_hook:
//   stage 1  all parameters and full gradients on every rank; on the last micro-batch of a step each
//            unit's gradients are reduce-scattered to their owners as soon as backward finishes the
//            unit (non-blocking, overlapping the rest of backward).
//   stage 2  no full gradient buffer: backward writes a unit's gradients into a window, which is
//            reduce-scattered on every micro-batch (each owner first adds what it accumulated so
//            far) and then reused.
//   stage 3  no full parameter buffer either: each rank keeps its slice in `shard_params`; a unit is
//            all-gathered into a window just before the model uses it, in forward and again in
//            backward, and with prefetch the unit the model names as next is gathered meanwhile.
// Windows: the embedding unit and the last unit (final norm, untied head) have one window each,
// kept from first use until the optimizer step; blocks rotate through two windows (the one in use
// and the one being gathered or reduced). So per rank, stage 3 holds
//   parameters  S + n(unit 0) + n(last unit) + 2 n(block)
//   gradients   S + n(unit 0) + n(last unit) + 2 n(block)     (stages 2 and 3)
//   optimizer   K * S                                          (stages 1-3)
// floats, against 3 * total for stage 0 with Adam (K = 2).
//
// After backward, sl_zero_finish_backward waits for every reduction; a step then runs the optimizer
// on the owned slice (sl_zero_step_params / shard_grads) and sl_zero_after_step shares the result:
// stages 1-2 all-gather the new parameters into every rank's full buffer, stage 3 only forgets its
// gathered windows.
//
// Memory: slices, windows and the model's buffers are allocated and touched through the model's ops
// table, so they are GPU memory under cuda (with the nccl comm backend) and host memory on the cpu.
// Every collective is queued behind the ops' stream (sl_comm_order_after); the host waits for a
// collective before handing its result to ops. Only the checkpoint helpers below take host buffers.
#ifndef SHARDLM_ZERO_H
#define SHARDLM_ZERO_H

#include <stddef.h>
#include "shardlm/comm.h"
#include "shardlm/model.h"

typedef struct {
    float *data;
    sl_bf16 *data_bf16;     // parameter windows with ops->act_bf16: data rounded to bf16 (the GEMMs' copy)
    int bf16_unit;          // the unit data_bf16 was made from, -1 when stale
    size_t cap;             // floats allocated
    int unit;               // the unit held (parameters: valid until the step), -1 for none
    int busy;               // the model is between GET and PUT on it
    int pending;            // a gather (parameters) or reduction (gradients) is in flight
    unsigned long stamp;    // last use, for choosing between the two block windows
    sl_comm_request req;
} sl_zero_window;

// The buffer ZeRO partitions and the owner's fields it takes over (frees, grows, points at windows).
typedef struct {
    size_t total;                     // floats
    int n_units;
    const size_t *unit_begin;         // (n_units + 1) unit u is [unit_begin[u], unit_begin[u + 1])
    float **params, **grads;          // the owner's full buffers
    size_t *capacity;                 // floats allocated in each
    sl_bf16 **weights_bf16;           // the owner's bf16 copy of params (ops->act_bf16), or NULL in it
    float **param_view, **grad_view;  // (n_units) where the model reads unit u
    sl_bf16 **weight_view;            // (n_units) unit u's bf16 copy
} sl_zero_buffer;

// The model's trained buffer: its adapters' when LoRA is attached, else its own parameters.
sl_zero_buffer sl_zero_buffer_of(sl_model *model);

typedef struct {
    sl_comm *dp;
    int rank, world, stage, prefetch;
    sl_model *model;
    sl_zero_buffer buf;         // what is partitioned (sl_zero_buffer_of(model))
    size_t total, shard_size, shard_begin, padded_total;
    float *shard_params;        // stage 3: (shard_size) this rank's parameters
    float *shard_grads;         // (shard_size) this rank's reduced gradient sums this step
    int reducing;               // the current backward reduces its gradients (see sl_zero_begin_backward)
    int accumulated;            // shard_grads holds earlier micro-batches' sums (stages 2-3)
    sl_zero_window pwin[4];     // parameter windows (stage 3): [0] unit 0, [1] last unit, [2..3] blocks
    sl_zero_window gwin[4];     // gradient windows (stages 2-3), same roles
    sl_comm_request *unit_req;  // stage 1: (n_units) the reduction of each unit's gradients
    size_t *counts, *displs;    // (world) scratch for the variable-count collectives
    unsigned long clock;
} sl_zero;

// Partitions the model's trained buffer (sl_zero_buffer_of) over dp (any size, 1 included) for stage
// 1, 2 or 3. Its parameters must already be equal on every rank. Stages 2-3 free its gradient buffer,
// stage 3 its parameter buffer too (params / grads become NULL; the views point at windows).
// Stages 1-2 grow params to padded_total floats so the parameter all-gather works in place.
int sl_zero_init(sl_zero *z, sl_model *model, sl_comm *dp, int stage, int prefetch);
void sl_zero_free(sl_zero *z);

// The model's unit hook for a ZeRO engine (ctx = sl_zero*).
int sl_zero_hook(void *ctx, sl_unit_event event, int unit, int next_unit);

// Before a micro-batch's backward: whether its gradients are reduced now (stage 1: only the last
// micro-batch of a step; stages 2-3 always).
void sl_zero_begin_backward(sl_zero *z, int last_micro);
// After backward: starts nothing new, waits for every reduction in flight.
int sl_zero_finish_backward(sl_zero *z);

// Where the optimizer finds this rank's slice of the parameters (shard_size floats).
float *sl_zero_step_params(sl_zero *z);
// Waits for any gather in flight (their source is about to change).
int sl_zero_before_step(sl_zero *z);
// After the optimizer updated the slice: stages 1-2 all-gather parameters, stage 3 drops its
// windows; gradients are zeroed for the next step.
int sl_zero_after_step(sl_zero *z);
// Zeroes every gradient (shard_grads and, for stage 1, the full buffer) and the accumulation state.
void sl_zero_zero_grads(sl_zero *z);

// Stage 3 (collective): the full parameters into `full` (total floats of HOST memory, filled unit by
// unit through the windows, so no full-size device buffer is needed) on every rank that passes one
// (NULL: this rank only takes part).
int sl_zero_gather_params(sl_zero *z, float *full);
// The same for any buffer in the backend's memory shaped like this rank's slice (the fp32 master
// weights); the windows are left empty afterwards.
int sl_zero_gather_slices(sl_zero *z, const float *slice, float *full);
// Stage 3 (collective): replaces every rank's slice from root's full parameters (HOST memory, total
// floats; NULL elsewhere), unit by unit through a window.
int sl_zero_scatter_params(sl_zero *z, const float *full, int root);

// Floats in one set of windows (parameters or gradients) of a buffer cut into n_units units at
// unit_begin (n_units + 1 offsets): unit 0 + last unit + 2 largest blocks.
size_t sl_zero_window_floats(int n_units, const size_t *unit_begin);

// The ZeRO paper's model-state memory per rank in fp32 (no separate master copy; K bytes of optimizer
// state per parameter: 8 for Adam), as an engine of this buffer (its units: a layout's, or LoRA
// adapters'), world and stage allocates it: with P parameters, N ranks, S = P/N rounded up (P at
// stage 0) and W the floats of the ZeRO-2/3 windows
// (sl_zero_window_floats); stages 1-2 pad the full buffers to N*S:
//   stage 0: 4P + 4P + KP      stage 1: 4P + 4(P + S) + KS
//   stage 2: 4P + 4(S + W) + KS    stage 3: 4(S + W) + 4(S + W) + KS
// memory_estimate.h builds the estimate of a whole run (mixed precision included) on it.
typedef struct {
    double params, grads, optim;  // bytes per rank
    double P, S, W, K;            // the formula's inputs (W 0 below stage 2)
    const char *formula;          // the stage's line above, e.g. "4P + 4(P+S) + KS"
} sl_zero_estimate;
sl_zero_estimate sl_zero_memory_estimate(int n_units, const size_t *unit_begin, int world, int stage,
                                         int optim_state_buffers);

// Bytes this rank allocated for parameters, gradients (model buffers, slices, windows).
void sl_zero_memory(const sl_zero *z, size_t *param_bytes, size_t *grad_bytes);

#endif
