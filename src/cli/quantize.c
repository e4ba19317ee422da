// quantize.c: `shardlm quantize`: reads a model (Hugging Face directory, checkpoint, or a bitsandbytes
// directory) and writes it with its linear weights in bitsandbytes' 4-bit or 8-bit layout, the files
// transformers writes after from_pretrained(..., quantization_config=BitsAndBytesConfig(...)).
#include "cli/args.h"
#include "cli/commands.h"
#include "shardlm/error.h"
#include "shardlm/manifest.h"
#include "shardlm/model_source.h"
#include "shardlm/quant_base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *f) {
    fprintf(f,
        "usage: shardlm quantize --model PATH --quantize nf4|fp4|int8 --output DIR\n\n"
        "Quantises the linear weights of a model as bitsandbytes does (embeddings, norms and the LM head\n"
        "stay in full precision) and writes DIR/model.safetensors + DIR/config.json (with transformers'\n"
        "quantization_config), which AutoModelForCausalLM.from_pretrained(DIR) loads.\n"
        "  --model PATH        Hugging Face directory (fp32 / bf16 / fp16 safetensors) or checkpoint\n"
        "  --quantize TYPE     nf4 (blocks of 64, double-quantised scales), fp4, or int8 (LLM.int8() rows)\n"
        "  --no-double-quant   nf4 / fp4 with plain fp32 block scales\n"
        "  --output DIR        new directory to create (must not exist)\n");
}

int cmd_quantize(int argc, char **argv) {
    char spec[4096] = "", out[4096] = "", qflag[16] = "";
    int no_dq = 0;
    sl_args a = {argc, argv, 1, NULL, 0};
    for (; a.i < argc && !a.error; a.i++) {
        if (!strcmp(argv[a.i], "--help") || !strcmp(argv[a.i], "-h")) { usage(stdout); return 0; }
        if (sl_arg_str(&a, "--model", spec, sizeof spec)) continue;
        if (sl_arg_str(&a, "--output", out, sizeof out)) continue;
        if (sl_arg_str(&a, "--quantize", qflag, sizeof qflag)) continue;
        if (sl_arg_switch(&a, "--no-double-quant")) { no_dq = 1; continue; }
        fprintf(stderr, "error: unknown flag '%s' (see shardlm quantize --help)\n", argv[a.i]);
        return 2;
    }
    if (a.error) return 2;
    if (!spec[0] || !out[0] || !qflag[0]) {
        fprintf(stderr, "error: quantize needs --model PATH, --quantize TYPE and --output DIR\n");
        return 2;
    }
    sl_quant_config qc;
    if (sl_quant_config_from_flag(qflag, &qc)) { fprintf(stderr, "error: %s\n", sl_error()); return 2; }
    if (qc.type == SL_QUANT_NONE) { fprintf(stderr, "error: --quantize: nf4, fp4 or int8 expected\n"); return 2; }
    if (no_dq) qc.double_quant = 0;
    struct stat st;
    if (stat(out, &st) == 0) { fprintf(stderr, "error: %s already exists (give a new directory)\n", out); return 2; }
    sl_model_source src;
    sl_model m;
    sl_quant_base qb = {0};
    int rc = -1, have_model = 0;
    if (sl_model_source_resolve(&src, spec)) goto done;
    if (!src.has_weights) { sl_errorf("%s: a preset or config has no weights to quantise", spec); goto done; }
    // the linears quantised one at a time as they load (quant_base.h): the fp32 model never exists
    if (sl_manifest_verify_weights_dir(src.weights_dir) || sl_quant_base_create(&qb, &m, &src, &qc, &sl_ops_cpu, 0))
        goto done;
    have_model = 1;
    if (sl_quant_model_save(out, &qb.qm, &m.layout, m.params)) goto done;
    char desc[96];
    printf("wrote %s: linears as %s, %.2f MB\n", out, sl_quant_config_describe(&qb.qm.qc, desc, sizeof desc),
           (double)sl_quant_base_bytes(&qb) / 1e6);
    rc = 0;
done:
    if (rc) fprintf(stderr, "error: %s\n", sl_error());
    if (have_model) sl_model_free(&m);
    sl_quant_base_free(&qb);
    return rc ? 1 : 0;
}
