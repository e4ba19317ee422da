// model_source.c: preset | config.json | HF directory | checkpoint -> config (+ weights location).
#include "shardlm/model_source.h"
#include "shardlm/checkpoint.h"
#include "shardlm/error.h"
#include "shardlm/hf_weights.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

int sl_model_source_resolve(sl_model_source *src, const char *spec) {
    memset(src, 0, sizeof *src);
    if (is_dir(spec)) {
        char latest[4200], dir[4096];
        snprintf(latest, sizeof latest, "%s/latest", spec);
        if (exists(latest)) {
            if (sl_ckpt_resolve(spec, dir, sizeof dir)) return -1;
        } else {
            snprintf(dir, sizeof dir, "%s", spec);
        }
        char adapter[4200], config[4200];
        snprintf(adapter, sizeof adapter, "%s/adapter_config.json", dir);
        snprintf(config, sizeof config, "%s/config.json", dir);
        if (exists(adapter) && !exists(config))
            return sl_errorf("%s holds a LoRA adapter (adapter_config.json), not a model: name its base model and "
                             "pass this directory as --adapter", dir);
        if (sl_hf_load_config(dir, &src->cfg)) return -1;
        src->has_weights = 1;
        snprintf(src->weights_dir, sizeof src->weights_dir, "%s", dir);
        return 0;
    }
    size_t n = strlen(spec);
    if (n > 5 && strcmp(spec + n - 5, ".json") == 0) return sl_config_load_json(&src->cfg, spec);
    if (strchr(spec, '/') && !exists(spec)) return sl_errorf("%s: no such file or directory", spec);
    return sl_config_preset(&src->cfg, spec);
}
