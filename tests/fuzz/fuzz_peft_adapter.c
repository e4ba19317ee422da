// fuzz_peft_adapter.c: PEFT's adapter_config.json (peft_adapter.c, lora_config.c): any bytes give
// LoRA settings that pass their range checks or one error, and settings that were read write and
// read back as the same settings.
#include "fuzz_common.h"
#include "shardlm/error.h"
#include "shardlm/peft_adapter.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static sl_lora_config cfg, back;  // ~150 KiB of names and pattern keys each: off the stack
    char path[128];
    fuzz_write("adapter_config.json", data, size, path, sizeof path);
    if (sl_peft_read_config(fuzz_tmpdir(), &cfg) == 0) {
        cJSON *obj = cJSON_CreateObject();
        sl_lora_config_defaults(&back);
        if (!obj || sl_lora_config_to_json(&cfg, obj) || sl_lora_config_parse(&back, obj, "written") ||
            back.r != cfg.r || back.lora_alpha != cfg.lora_alpha || back.lora_dropout != cfg.lora_dropout ||
            back.use_rslora != cfg.use_rslora || back.all_linear != cfg.all_linear || back.use_dora != cfg.use_dora ||
            back.bias != cfg.bias || back.init_lora_weights != cfg.init_lora_weights ||
            back.target_regex != cfg.target_regex || back.n_layers != cfg.n_layers ||
            memcmp(back.layers_to_transform, cfg.layers_to_transform, sizeof(int) * (size_t)cfg.n_layers) != 0 ||
            strcmp(back.layers_pattern, cfg.layers_pattern) != 0 ||
            strcmp(back.target_modules, cfg.target_modules) != 0 || back.exclude_regex != cfg.exclude_regex ||
            back.n_exclude != cfg.n_exclude || strcmp(back.exclude_modules, cfg.exclude_modules) != 0 ||
            back.n_modules_to_save != cfg.n_modules_to_save || strcmp(back.modules_to_save, cfg.modules_to_save) != 0 ||
            back.n_token_indices != cfg.n_token_indices || strcmp(back.token_module, cfg.token_module) != 0 ||
            memcmp(back.token_indices, cfg.token_indices, sizeof(int) * (size_t)cfg.n_token_indices) != 0 ||
            !sl_lora_pattern_map_equal(&back.rank_pattern, &cfg.rank_pattern) ||
            !sl_lora_pattern_map_equal(&back.alpha_pattern, &cfg.alpha_pattern)) {
            fprintf(stderr, "written adapter config does not read back: %s\n", sl_error());
            abort();
        }
        cJSON_Delete(obj);
    }
    return 0;
}
