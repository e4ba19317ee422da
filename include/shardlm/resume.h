// resume.h: may this run continue a checkpoint's data stream, and from which batch? `shardlm train`
// saves its loader position and resolved configuration as a checkpoint's client state; on resume
// they are read back into typed fields (sl_resume_state_parse) and compared with this run's
// configuration (sl_resume_check). A refusal names the field, the checkpoint's value and this run's.
//
// The position counts windows of micro_batch x seq_len tokens per rank. A run may change its number
// of ranks (and its micro batch, when it does not shuffle) as long as the same global sequence of
// windows continues: the position is rescaled to this run's batches. seq_len, seed, shuffling and the
// data directory must stay.
#ifndef SHARDLM_RESUME_H
#define SHARDLM_RESUME_H

#include <stdint.h>
#include "shardlm/loader.h"
#include "shardlm/train_config.h"

typedef struct {
    sl_loader_position position;  // the loader's position when the checkpoint was saved
    int64_t micro_batch;          // train_micro_batch_size_per_gpu
    int64_t grad_accum;           // gradient_accumulation_steps (1 when absent)
    int64_t train_batch_size;     // micro x accumulation x data-parallel ranks of that run
    int64_t seq_len, seed;        // shardlm.seq_len, shardlm.seed
    int shuffle;                  // shardlm.shuffle (1 when absent)
    int threads;                  // shardlm.threads (0 when absent)
    sl_quant_config quant;        // quantization_config: the base the adapters were trained on (NONE when absent)
    char data[SL_PATH_MAX];       // shardlm.data
} sl_resume_state;

// Reads the client state `shardlm train` saved ({"loader": {...}, "config": {...}}). -1 with a message
// naming the field (under "trainer_state.json client_state") when one is missing or out of range.
int sl_resume_state_parse(sl_resume_state *s, const char *client_state_json);

typedef struct {
    sl_loader_position position;  // where this run's loader continues (sl_loader_seek)
    int n_warnings;
    char warnings[2][160];        // changes that are allowed but worth a line: batch size, thread count
} sl_resume_plan;

// Checks this run's resolved configuration c (c->world_size set) against the saved state and computes
// the position in this run's batches; batches_per_epoch is this run's training loader's. -1 with a
// message naming the field that differs (old and new value) or why the position does not map.
int sl_resume_check(const sl_resume_state *s, const sl_train_config *c, int64_t batches_per_epoch,
                    sl_resume_plan *plan);

#endif
