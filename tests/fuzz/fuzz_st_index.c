// fuzz_st_index.c: a sharded checkpoint's model.safetensors.index.json. The directory also holds a
// real shard of a tiny LLaMA (written once), so inputs that name its tensors reach the loading code.
#include "fuzz_common.h"
#include "shardlm/config.h"
#include "shardlm/error.h"
#include "shardlm/hf_weights.h"
#include "shardlm/layout.h"

#include <sys/stat.h>

static sl_param_layout layout;
static float *params;
static char dir[128];

static void setup(void) {
    sl_model_config cfg;
    if (sl_config_preset(&cfg, "llama-tiny") || sl_layout_build(&layout, &cfg)) abort();
    params = calloc(layout.total, sizeof(float));
    if (!params) abort();
    snprintf(dir, sizeof dir, "%s/index", fuzz_tmpdir());
    char shard[192];
    snprintf(shard, sizeof shard, "%s/shard-1.safetensors", dir);
    if (mkdir(dir, 0755) || sl_hf_save(shard, &layout, params)) { fprintf(stderr, "%s\n", sl_error()); abort(); }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!params) setup();
    char path[192];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size)) abort();
    fclose(f);
    (void)sl_hf_load(path, &layout, params);
    return 0;
}
