// fuzz_train_config.c: a DeepSpeed-style training config file, read and resolved.
#include "fuzz_common.h"
#include "shardlm/train_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128];
    fuzz_write("ds_config.json", data, size, path, sizeof path);
    sl_train_config c;
    sl_train_config_defaults(&c);
    if (sl_train_config_load_json(&c, path) == 0) (void)sl_train_config_resolve(&c, 7);
    sl_train_config_free(&c);
    return 0;
}
