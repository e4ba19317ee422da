// optim_8bit.h: 8-bit AdamW (optimizer.type "AdamW8bit", bitsandbytes.optim.AdamW8bit) over a range of
// the flat parameter buffer: which tensors get 8-bit blockwise state and which keep 32-bit state
// (min_8bit_size), where each block and each tensor's state lives (the plan), the state buffers, the
// step's scalars, and the step itself, with the exchange a ZeRO shard boundary needs.
//
// Blocks are bitsandbytes': 256 elements counted from each tensor's first element, so a single
// process holds exactly bitsandbytes' per-tensor state. A ZeRO shard [begin, end) is an equal slice
// of the flat buffer and need not fall on a block boundary: the block it cuts (at most one at each
// end) is shared by two (or more) ranks, each holding its elements' codes and the block's absmax.
// The step then measures each rank's part of the cut block's new absmax and takes the maximum over
// the group (one small all-gather) before requantising, so every rank ends with the same absmax and
// the state equals a single process's, block for block, at any world size. Checkpoints store the
// state in this form (per-tensor blocks), which is why they load at any world size too.
//
// State bytes on a rank: 2 per 8-bit element + 8 per block (two float absmax) + 8 per 32-bit element.
#ifndef SHARDLM_OPTIM_8BIT_H
#define SHARDLM_OPTIM_8BIT_H

#include <stddef.h>
#include <stdint.h>

#include "shardlm/comm.h"
#include "shardlm/layout.h"
#include "shardlm/ops.h"
#include "shardlm/optim.h"

typedef struct {
    size_t begin, end;        // flat range covered (end clipped to the layout's total)
    sl_adam8_segment *segs;   // one per tensor part in [begin, end), in order
    int *seg_tensor;          // the table index of each segment's tensor
    size_t *seg_block0;       // quantized segments: the tensor-relative index of their first block
    int n_segs;
    size_t n8, n32, n_blocks; // elements with 8-bit state, elements with 32-bit state, absmax slots
    // flat offsets of the blocks cut at the range's ends (their first element, whichever rank holds it)
    int has_head, has_tail;
    size_t head_block, tail_block;
} sl_adam8_plan;

// The plan for [begin, end) of a flat buffer of `total` floats holding n_tensors tensors in offset
// order (a model layout's, or LoRA adapters' table; end past the total is clipped: ZeRO padding has
// no state). Decay per tensor as the decay mask's (weight_decay > 0 and the tensor decays, or
// decay_all).
int sl_adam8_plan_build(sl_adam8_plan *plan, const sl_tensor_info *tensors, int n_tensors, size_t total,
                        const sl_optim_config *cfg, size_t begin, size_t end);
void sl_adam8_plan_free(sl_adam8_plan *plan);
size_t sl_adam8_state_bytes(const sl_adam8_plan *plan);

// Host buffers for a plan's state, zero (bitsandbytes' initial state). Free with sl_adam8_state_free.
int sl_adam8_state_alloc(sl_adam8_state *st, const sl_adam8_plan *plan);
void sl_adam8_state_free(sl_adam8_state *st);

// The state of two plans over the same layout and min_8bit_size, matched element by element and
// block by block where their ranges overlap: fn(ctx, part, src index, dst index, count) is called for
// each run, in order (a cut block's absmax may come twice, from both sides: the values are equal).
// This is how a checkpoint saved at one world size loads at another. -1 when fn fails or the two
// plans disagree on a tensor's kind of state.
typedef enum { SL_ADAM8_CODES, SL_ADAM8_ABSMAX, SL_ADAM8_FLOATS } sl_adam8_part;
typedef int (*sl_adam8_run_fn)(void *ctx, sl_adam8_part part, size_t src, size_t dst, size_t count);
int sl_adam8_overlap(const sl_adam8_plan *dst, const sl_adam8_plan *src, sl_adam8_run_fn fn, void *ctx);

// The scalars of step `step` (from 1) at `lr`, in double as Python computes them, then float.
void sl_adam8_args_make(const sl_optim_config *cfg, double lr, int64_t step, sl_adam8_args *a);

// A rank's cut blocks as 6 doubles: head block's flat offset (-1 when none), its two measured absmax,
// then the same for the tail. sl_adam8_edges_combine: for this plan's cut blocks, the maximum over
// every record (n_ranks of them, this rank's included) naming the same block.
void sl_adam8_edges_record(const sl_adam8_plan *plan, const sl_adam8_edges *measured, double record[6]);
void sl_adam8_edges_combine(const sl_adam8_plan *plan, const double *records, int n_ranks, sl_adam8_edges *edges);

// One step of the plan's range on `ops` (its adam8_step; -1 with a message where it has none).
// params and grads point at element plan->begin. `group`: the ZeRO group whose ranks hold the other
// parts of cut blocks (NULL or size 1: none); collective over it, every rank calls it every step.
int sl_adam8_step(const sl_ops *ops, const sl_optim_config *cfg, const sl_adam8_plan *plan, sl_adam8_state *st,
                  double lr, int64_t step, float *params, const float *grads, sl_comm *group);

#endif
