// attention_choice.c: SHARDLM_ATTENTION resolved (see attention_choice.h).
#include "shardlm/attention_choice.h"
#include "shardlm/settings.h"

#include <string.h>

static int training_engines;  // engines alive (sl_attention_training)
static int cudnn_unusable;    // sl_attention_cudnn_unusable was called
static unsigned ran;          // bits 1 << SL_ATTENTION_* of the kernels that ran
static size_t cudnn_version;  // the libcudnn loaded (sl_attention_note_cudnn)

void sl_attention_training(int begin) { training_engines += begin ? 1 : (training_engines > 0 ? -1 : 0); }

void sl_attention_cudnn_unusable(void) { cudnn_unusable = 1; }

int sl_attention_kind(void) {
    const int a = sl_settings_get()->attention;
    if (a != SL_ATTENTION_AUTO) return a;
    return training_engines > 0 && !cudnn_unusable ? SL_ATTENTION_CUDNN : SL_ATTENTION_MMA;
}

void sl_attention_note_ran(int kind) {
    if (kind >= 0 && kind < 32) ran |= 1u << kind;
}

unsigned sl_attention_ran(void) { return ran; }

const char *sl_attention_ran_name(void) {
    static char name[64];
    name[0] = '\0';
    static const int order[] = {SL_ATTENTION_CUDNN, SL_ATTENTION_MMA, SL_ATTENTION_TC, SL_ATTENTION_SIMT};
    for (int i = 0; i < 4; i++)
        if (ran & (1u << order[i])) {
            if (name[0]) strcat(name, "+");
            strcat(name, sl_attention_name(order[i]));
        }
    return name;
}

void sl_attention_note_cudnn(size_t version) { cudnn_version = version; }

size_t sl_attention_cudnn_version(void) { return cudnn_version; }
