// fuzz_hf_config.c: Hugging Face config.json (hf_config.c): any bytes give a config that validates or
// one error, and a config that was read writes and reads back as the same model.
#include "fuzz_common.h"
#include "shardlm/config.h"
#include "shardlm/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_text(data, size);
    sl_model_config cfg, back;
    if (sl_config_from_json_text(&cfg, text, "config.json") == 0) {
        char *json = sl_config_to_json_text(&cfg);
        if (!json || sl_config_from_json_text(&back, json, "written") || sl_config_compare(&cfg, &back, "round trip")) {
            fprintf(stderr, "written config does not read back: %s\n", sl_error());
            abort();
        }
        free(json);
    }
    free(text);
    return 0;
}
