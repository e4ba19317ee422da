// main.c: `shardlm <command> [flags]`: dispatches to one file per subcommand.
#include "cli/commands.h"
#include "shardlm/cpu_features.h"
#include "shardlm/error.h"
#include "shardlm/settings.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: shardlm <command> [flags]\n\n"
            "commands:\n"
            "  prepare    tokenize text files into train/val token shards (llm.c format)\n"
            "  train      train or fine-tune a GPT-2 / LLaMA model (DeepSpeed-style JSON config + flags)\n"
            "  generate   sample text from a checkpoint or Hugging Face model directory\n"
            "  convert    consolidate a (sharded) checkpoint into one Hugging Face directory\n"
            "  merge      merge a LoRA adapter into its base model (PEFT's merge_and_unload)\n"
            "  quantize   write a model's linears in bitsandbytes' 4-bit / 8-bit layout (transformers loads it)\n"
            "  launch     run a program on N ranks (torchrun / deepspeed launcher on srun, mpirun or fork)\n"
            "  report     print what this build and machine have: libraries, backends, GPUs (ds_report)\n\n"
            "Run `shardlm <command> --help` for the command's flags.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 2; }
    const char *cmd = argv[1];
    const char *missing = sl_cpu_missing_build_isa();
    if (missing[0]) {
        fprintf(stderr, "error: this binary was built for instruction sets this CPU lacks: %s. Rebuild it on this "
                        "machine (`make`), or build one for both machines with `make ARCH=x86-64-v3` (docs/cli.md)\n",
                missing);
        return 1;
    }
    // the environment's switches, read once (settings.h); `report` shows a malformed one instead
    if (sl_settings_load() && strcmp(cmd, "report")) {
        fprintf(stderr, "error: %s\n", sl_error());
        return 2;
    }
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) { usage(stdout); return 0; }
    if (!strcmp(cmd, "prepare")) return cmd_prepare(argc - 1, argv + 1);
    if (!strcmp(cmd, "train")) return cmd_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "generate")) return cmd_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "convert")) return cmd_convert(argc - 1, argv + 1);
    if (!strcmp(cmd, "merge")) return cmd_merge(argc - 1, argv + 1);
    if (!strcmp(cmd, "quantize")) return cmd_quantize(argc - 1, argv + 1);
    if (!strcmp(cmd, "launch")) return cmd_launch(argc - 1, argv + 1);
    if (!strcmp(cmd, "report")) return cmd_report(argc - 1, argv + 1);
    fprintf(stderr, "shardlm: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
