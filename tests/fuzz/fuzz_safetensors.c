// fuzz_safetensors.c: one .safetensors file opened, every float tensor read through both readers.
#include "fuzz_common.h"
#include "shardlm/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128];
    fuzz_write("t.safetensors", data, size, path, sizeof path);
    sl_st_file f;
    if (sl_st_open(&f, path)) return 0;
    for (int i = 0; i < f.n_tensors; i++) {
        if (!sl_st_dtype_is_float(f.tensors[i].dtype) || f.tensors[i].numel > (1u << 20)) continue;
        size_t n = f.tensors[i].numel;
        float *out = malloc(sizeof(float) * (n ? n : 1));
        if (!out) abort();
        (void)sl_st_read_f32(&f, i, out, n);
        if (n > 2) (void)sl_st_read_f32_range(&f, i, 1, n - 2, out);
        free(out);
    }
    sl_st_close(&f);
    return 0;
}
