// convert.c: `shardlm convert`: consolidates a (sharded) checkpoint into one Hugging Face directory,
// as DeepSpeed's zero_to_fp32.py does.
#include "cli/args.h"
#include "cli/commands.h"
#include "shardlm/engine.h"
#include "shardlm/error.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
        "usage: shardlm convert --checkpoint PATH --output DIR [--with-optimizer]\n\n"
        "Consolidates a checkpoint written at any world size and ZeRO stage into DIR holding one\n"
        "model.safetensors + config.json that transformers loads with from_pretrained.\n"
        "  --checkpoint PATH   checkpoint root (uses its `latest`) or tag directory\n"
        "  --output DIR        new directory to create (must not exist)\n"
        "  --with-optimizer    also write the full optimizer state as optimizer.safetensors\n");
}

int cmd_convert(int argc, char **argv) {
    char ckpt[4096] = "", out[4096] = "";
    int with_opt = 0;
    sl_args a = {argc, argv, 1, NULL, 0};
    for (; a.i < argc && !a.error; a.i++) {
        if (!strcmp(argv[a.i], "--help") || !strcmp(argv[a.i], "-h")) { usage(stdout); return 0; }
        if (sl_arg_str(&a, "--checkpoint", ckpt, sizeof ckpt)) continue;
        if (sl_arg_str(&a, "--output", out, sizeof out)) continue;
        if (sl_arg_switch(&a, "--with-optimizer")) { with_opt = 1; continue; }
        fprintf(stderr, "error: unknown flag '%s' (see shardlm convert --help)\n", argv[a.i]);
        return 2;
    }
    if (a.error) return 2;
    if (!ckpt[0] || !out[0]) {
        fprintf(stderr, "error: convert needs --checkpoint PATH and --output DIR\n");
        return 2;
    }
    if (sl_checkpoint_consolidate(ckpt, out, with_opt)) {
        fprintf(stderr, "error: %s\n", sl_error());
        return 1;
    }
    printf("wrote %s (model.safetensors, config.json%s)\n", out, with_opt ? ", optimizer.safetensors" : "");
    return 0;
}
