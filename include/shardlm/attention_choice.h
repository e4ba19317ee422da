// attention_choice.h: which bf16 attention kernels run, SHARDLM_ATTENTION resolved. auto (the
// default) means cuDNN's fused attention while a training engine lives (a GPU run measured it faster
// and checked its numbers; generation would build a cuDNN plan per prompt length) and the mma.sync
// kernels otherwise: the engine says when training begins and ends, the CUDA attention says when cuDNN
// cannot serve the process, and every attention call notes which kernels ran (for the benchmarks'
// records). One host thread, as the ops.
#ifndef SHARDLM_ATTENTION_CHOICE_H
#define SHARDLM_ATTENTION_CHOICE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// A training engine starts (1) or ends (0): sl_engine_init / sl_engine_detach_model or sl_engine_free.
// A count, so nested engines work; never below 0.
void sl_attention_training(int begin);
// Under auto, the GPU's cuDNN path says it cannot serve this process (no libcudnn, or one older than
// 9.11; a handle it cannot create; a graph it refuses): auto resolves to mma from then on (the reason
// is logged once, as a warning).
void sl_attention_cudnn_unusable(void);
// SHARDLM_ATTENTION resolved: its value, or for auto SL_ATTENTION_CUDNN while a training engine is
// alive (and cuDNN was not found unusable) and SL_ATTENTION_MMA otherwise. (For auto, the cuDNN path
// further takes only the shapes a GPU run has checked: attention_cudnn.cu's auto_checked.)
int sl_attention_kind(void);
// An attention call ran on the kernels of kind (an SL_ATTENTION_* value); the kinds noted so far as
// bits (1 << kind), and the same as a word ("cudnn", "mma", "cudnn+mma", ...; "" when none: the CPU).
void sl_attention_note_ran(int kind);
unsigned sl_attention_ran(void);
const char *sl_attention_ran_name(void);
// The libcudnn the GPU's cuDNN path loaded: its version (cudnnGetVersion's: 9.19.0 is 91900), noted
// once it loads; 0 until then (and on the CPU).
void sl_attention_note_cudnn(size_t version);
size_t sl_attention_cudnn_version(void);

#ifdef __cplusplus
}
#endif

#endif
