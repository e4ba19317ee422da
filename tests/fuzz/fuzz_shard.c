// fuzz_shard.c: an llm.c token shard, opened and read against GPT-2's and a tiny vocabulary.
#include "fuzz_common.h"
#include "shardlm/shard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128];
    fuzz_write("train_000000.bin", data, size, path, sizeof path);
    int32_t *tokens = NULL;
    size_t n = 0;
    if (sl_shard_read(path, 50257, &tokens, &n) == 0) free(tokens);
    tokens = NULL;
    if (sl_shard_read(path, 100, &tokens, &n) == 0) free(tokens);
    return 0;
}
