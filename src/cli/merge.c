// merge.c: `shardlm merge`: a base model plus a LoRA adapter into one Hugging Face model, as PEFT's
// merge_and_unload() makes it (W += scale * B @ A for every adapted linear), stored in the base's
// dtype. Written into a temporary sibling of OUT and renamed into place: a failure leaves nothing.
#include "cli/args.h"
#include "cli/commands.h"
#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/hf_weights.h"
#include "shardlm/lora.h"
#include "shardlm/manifest.h"
#include "shardlm/model_source.h"
#include "shardlm/ops.h"
#include "shardlm/peft_adapter.h"
#include "shardlm/precision.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f,
        "usage: shardlm merge --model BASE --adapter DIR --output OUT [flags]\n\n"
        "Merges a LoRA adapter (PEFT's adapter_config.json + adapter_model.safetensors, or a shardlm LoRA\n"
        "checkpoint) into its base model and writes OUT: model.safetensors + config.json (and the base's\n"
        "tokenizer files) that transformers loads, equal to PEFT's merge_and_unload().\n"
        "  --model BASE        the base: a Hugging Face directory or a shardlm checkpoint\n"
        "  --adapter DIR       the adapter\n"
        "  --output OUT        new directory to create (must not exist)\n"
        "  --dtype T           float32 | bfloat16 | float16 (default: the base's weights' dtype)\n"
        "  --no-verify         read a checkpoint base without checking it against its manifest.json\n"
        "  --threads N         CPU threads\n");
}

// The tokenizer and generation files of a Hugging Face directory travel with the merged model.
static int copy_side_files(const char *from, const char *to) {
    static const char *names[] = {"vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json",
                                  "special_tokens_map.json", "generation_config.json", "tokenizer.model"};
    char src[4400], dst[4400];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(src, sizeof src, "%s/%s", from, names[i]);
        snprintf(dst, sizeof dst, "%s/%s", to, names[i]);
        if (access(src, F_OK) != 0) continue;
        size_t len;
        char *data = sl_read_text_file(src, &len);
        int rc = data ? sl_write_file_atomic(dst, data, len) : -1;
        free(data);
        if (rc) return -1;
    }
    return 0;
}

static int parse_dtype(const char *name, sl_st_dtype *dt) {
    if (!strcmp(name, "float32")) *dt = SL_ST_F32;
    else if (!strcmp(name, "bfloat16")) *dt = SL_ST_BF16;
    else if (!strcmp(name, "float16")) *dt = SL_ST_F16;
    else return sl_errorf("--dtype must be float32, bfloat16 or float16 (got '%s')", name);
    return 0;
}

static int merge(const char *base, const char *adapter, const char *out, const char *dtype_name, int no_verify) {
    struct stat st;
    if (stat(out, &st) == 0) return sl_errorf("%s exists already: --output names a new directory", out);
    sl_model_source src;
    if (sl_model_source_resolve(&src, base)) return -1;
    if (!src.has_weights) return sl_errorf("%s: merging needs the base's weights (a Hugging Face directory or a checkpoint)",
                                           base);
    if (!no_verify && sl_manifest_verify_weights_dir(src.weights_dir)) return -1;
    sl_st_dtype dtype = SL_ST_F32;
    if (dtype_name[0] ? parse_dtype(dtype_name, &dtype) : sl_hf_weights_dtype(src.weights_dir, &dtype)) return -1;
    if (dtype == SL_ST_F64) dtype = SL_ST_F32;  // the writer stores 32 or 16 bits
    sl_param_layout L;
    sl_lora lora;
    memset(&lora, 0, sizeof lora);
    if (sl_layout_build(&L, &src.cfg)) return -1;
    float *params = sl_calloc(L.total, sizeof(float), "base weights");
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", out, (int)getpid());
    int rc = !params || sl_hf_load(src.weights_dir, &L, params) ||
             sl_peft_load(adapter, &src.cfg, &sl_ops_cpu, &lora) ||
             sl_lora_merge(&lora, &L, params, dtype == SL_ST_BF16 ? sl_round_to_bf16
                                              : dtype == SL_ST_F16 ? sl_round_to_fp16 : NULL) ||
             sl_hf_save_as(tmp, &L, params, dtype) || copy_side_files(src.weights_dir, tmp);
    if (rc == 0 && rename(tmp, out) != 0) rc = sl_errorf("%s: cannot rename %s into place", out, tmp);
    if (rc) {
        char keep[2048];
        snprintf(keep, sizeof keep, "%s", sl_error());
        sl_remove_tree(tmp);
        sl_errorf("%s", keep);
    } else {
        char ranks[96], copies[1024];
        sl_lora_describe(&lora, 1, ranks, sizeof ranks);
        size_t copied = sl_lora_saved_describe(&lora, copies, sizeof copies);
        printf("merged %d adapters (%s)%s%s into %s -> %s (%s)\n", lora.n_adapters + (lora.embed_A >= 0), ranks,
               copied ? " and the trained copies of " : "", copied ? copies : "", base, out, sl_st_dtype_name(dtype));
    }
    sl_lora_free(&lora);
    free(params);
    sl_layout_free(&L);
    return rc ? -1 : 0;
}

int cmd_merge(int argc, char **argv) {
    char base[4096] = "", adapter[4096] = "", out[4096] = "", dtype[32] = "";
    int no_verify = 0, threads = 0;
    sl_args a = {argc, argv, 1, NULL, 0};
    for (; a.i < argc && !a.error; a.i++) {
        if (!strcmp(argv[a.i], "--help") || !strcmp(argv[a.i], "-h")) { usage(stdout); return 0; }
        if (sl_arg_str(&a, "--model", base, sizeof base)) continue;
        if (sl_arg_str(&a, "--adapter", adapter, sizeof adapter)) continue;
        if (sl_arg_str(&a, "--output", out, sizeof out)) continue;
        if (sl_arg_str(&a, "--dtype", dtype, sizeof dtype)) continue;
        if (sl_arg_switch(&a, "--no-verify")) { no_verify = 1; continue; }
        if (sl_arg_int(&a, "--threads", 0, SL_NO_MAX, &threads)) continue;
        fprintf(stderr, "error: unknown flag '%s' (see shardlm merge --help)\n", argv[a.i]);
        return 2;
    }
    if (a.error) return 2;
    if (!base[0] || !adapter[0] || !out[0]) {
        fprintf(stderr, "error: merge needs --model BASE, --adapter DIR and --output OUT\n");
        return 2;
    }
    if (sl_ops_cpu_set_threads(threads)) {
        fprintf(stderr, "error: --threads: %s\n", sl_error());
        return 1;
    }
    if (merge(base, adapter, out, dtype, no_verify)) {
        fprintf(stderr, "error: %s\n", sl_error());
        return 1;
    }
    return 0;
}
