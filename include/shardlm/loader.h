// loader.h: micro-batches of token windows from shards, llm.c style, for data-parallel training.
//
// A window is B*T+1 contiguous tokens of one shard; window k of a shard starts at token k*B*T, so a
// shard of n tokens has (n-1)/(B*T) windows. A batch is one window: inputs = window[0 .. B*T),
// targets = window[1 .. B*T] (inputs shifted by one), each laid out (B, T) row-major.
//
// An epoch orders all windows of all shards: shards in a permutation of the sorted shard list, and the
// windows of each shard in a permutation of their own. Both are pure functions of (seed, epoch) (and
// the shard's index), drawn from sl_rng (SL_RNG_DATA); without shuffle both are the identity. Global
// window g of the epoch goes to rank g % world, so the ranks of one epoch never share a window; each
// rank takes floor(total_windows / world) batches per epoch (the leftover windows are skipped that
// epoch) so that all ranks stay in lockstep, then the next epoch starts with fresh permutations.
//
// The position (epoch, batch) is the same on every rank and determines everything else: save it (as
// JSON, see sl_loader_position_to_json) and sl_loader_seek to it on resume to get identical batches.
#ifndef SHARDLM_LOADER_H
#define SHARDLM_LOADER_H

#include <stddef.h>
#include <stdint.h>

typedef struct sl_loader sl_loader;

typedef struct {
    const char *pattern;  // a glob ("data/sotu/train_*.bin"), one shard file, or a directory
    const char *split;    // with a directory: "train" / "val" selects DIR/SPLIT_*.bin; NULL = DIR/*.bin
    int micro_batch;      // B
    int seq_len;          // T
    int rank, world;      // this process's data-parallel rank in [0, world)
    uint64_t seed;
    int shuffle;          // 0: shards in name order, windows in file order (validation)
    int vocab_size;       // > 0: every token read is checked to be below it
} sl_loader_config;

typedef struct {
    int64_t epoch;   // epochs completed
    int64_t batch;   // batches taken by each rank in this epoch
    // Informational (this rank's next batch; sl_loader_seek ignores them):
    int64_t shard;   // index into the sorted shard list
    int64_t window;  // window index within that shard
} sl_loader_position;

// Finds the shards (sorted by name), validates their headers and checks there is at least one window
// per rank. Errors name the pattern when nothing matches.
int sl_loader_open(sl_loader **out, const sl_loader_config *cfg);
void sl_loader_close(sl_loader *l);

// Fills inputs and targets, each (B, T) int32, with this rank's next batch and advances.
int sl_loader_next(sl_loader *l, int32_t *inputs, int32_t *targets);

// Back to the start of epoch 0 (what a validation loop does before each evaluation).
void sl_loader_reset(sl_loader *l);

sl_loader_position sl_loader_tell(sl_loader *l);  // not const: may refill the permutation cache
// Restores a position from sl_loader_tell (possibly of another process with the same data, B, T,
// world, seed and shuffle). Fails if batch is outside [0, batches_per_epoch) or epoch < 0.
int sl_loader_seek(sl_loader *l, const sl_loader_position *pos);

// {"epoch": E, "batch": B, "shard": S, "window": W} into buf; returns 0, or -1 if buf is too small.
int sl_loader_position_to_json(const sl_loader_position *pos, char *buf, size_t cap);
// Parses that JSON (extra keys ignored; epoch and batch required).
int sl_loader_position_from_json(const char *json, sl_loader_position *pos);

int64_t sl_loader_batches_per_epoch(const sl_loader *l);  // per rank
int64_t sl_loader_num_tokens(const sl_loader *l);         // all shards
int sl_loader_num_shards(const sl_loader *l);
const char *sl_loader_shard_path(const sl_loader *l, int i);

#endif
