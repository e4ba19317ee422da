// fuzz_manifest.c: a checkpoint's manifest.json, read strictly and verified against the files it
// names. The directory holds a real model.safetensors, config.json and optimizer shard (written once),
// so inputs that name them with the right sizes reach the hashing and tiling checks.
#include "fuzz_common.h"
#include "shardlm/manifest.h"

#include <sys/stat.h>

static char dir[160];

static void setup(void) {
    snprintf(dir, sizeof dir, "%s/ckpt", fuzz_tmpdir());
    if (mkdir(dir, 0755)) abort();
    static const char *const names[] = {"model.safetensors", "config.json", "optim_00000_of_00001.safetensors"};
    for (int i = 0; i < 3; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        FILE *f = fopen(path, "wb");
        if (!f) abort();
        fprintf(f, "%s holds a few bytes", names[i]);
        fclose(f);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) setup();
    char path[256];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size)) abort();
    fclose(f);
    sl_manifest m;
    if (sl_manifest_load(&m, dir, 1000, SL_VERIFY_ALL) == 0) sl_manifest_free(&m);
    if (sl_manifest_load(&m, dir, 0, SL_VERIFY_NONE) == 0) sl_manifest_free(&m);
    (void)sl_manifest_verify_weights_dir(dir);
    return 0;
}
