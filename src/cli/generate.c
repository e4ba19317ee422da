// generate.c: `shardlm generate`: loads a checkpoint or Hugging Face directory and samples text with
// temperature, top-k and top-p through the KV cache, streaming tokens as they are produced. With
// --device cuda the model, its KV cache and every activation live on the GPU (the model's cached
// forward is backend-independent); each new token copies one row of logits back for the sampler.
#include "cli/args.h"
#include "cli/commands.h"
#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/generate.h"
#include "shardlm/hf_weights.h"
#include "shardlm/json_get.h"
#include "shardlm/manifest.h"
#include "shardlm/model_source.h"
#include "shardlm/peft_adapter.h"
#include "shardlm/quant_base.h"
#include "shardlm/precision.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static void usage(FILE *f) {
    fprintf(f,
        "usage: shardlm generate --model PATH [flags]\n\n"
        "Samples text from a shardlm checkpoint (root or tag directory) or a Hugging Face model directory.\n\n"
        "  --model PATH          checkpoint root / tag directory / HF directory (default runs/demo)\n"
        "  --tokenizer DIR       tokenizer.json, or vocab.json + merges.txt (default: the model directory, else\n"
        "                        the tokenizer of the data the checkpoint was trained on)\n"
        "  --prompt TEXT         prompt, encoded as transformers' tokenizer(TEXT) (LLaMA's <s> first)\n"
        "                        (default: start from the bos token, else <|endoftext|>)\n"
        "  --prompt-ids LIST     the prompt as comma-separated token ids instead of text; the tokenizer is\n"
        "                        then optional, and without one the new tokens are printed as ids\n"
        "  --max-new-tokens N    (default 128; 0 with --logits-out: the prompt's logits only)\n"
        "  --temperature T       0 = greedy (default 0.8)\n"
        "  --top-k K             0 = off (default 40)\n"
        "  --top-p P             1 = off (default 0.95)\n"
        "  --seed S              (default 0)\n"
        "  --stop-at-eot         stop when an end-of-text token is sampled: the tokenizer's eos, or any\n"
        "                        eos_token_id of the model's config.json / generation_config.json\n"
        "  --threads N           CPU threads\n"
        "  --device D            cpu | cuda | cuda:N (default cpu). cuda: the weights, the KV cache and the\n"
        "                        activations stay on the GPU (cuda: GPU 0 of CUDA_VISIBLE_DEVICES); each new\n"
        "                        token copies back one row of logits for the sampler. --dtype bf16 there\n"
        "                        uses bf16 activations (the cuda-bf16 table); --quantize is CPU-only\n"
        "  --quantize TYPE       nf4 | fp4 | int8: quantise the linear weights on load as bitsandbytes does\n"
        "                        (nf4 with double-quantised scales); a bitsandbytes 4-bit / 8-bit directory\n"
        "                        (quantization_config in its config.json) is read quantised without it\n"
        "  --dtype fp32|bf16     the weights (and activations) to compute with (default fp32; vLLM's flag,\n"
        "                        also spelt float32 / bfloat16; --precision is the same flag). bf16 holds the\n"
        "                        weights rounded to bf16 (half the bytes a decoded token reads) and runs the\n"
        "                        bf16 CPU table: vdpbf16ps / oneDNN's bf16 matmul where the CPU has bf16\n"
        "                        instructions, the slow bf16 emulation (with a notice) where it has not\n"
        "  --no-verify           load a checkpoint without checking its files' sizes and FNV-1a checksums\n"
        "                        against manifest.json (default: checked)\n"
        "  --adapter DIR         add a LoRA adapter (PEFT's adapter_config.json + adapter_model.safetensors,\n"
        "                        or a shardlm LoRA checkpoint) to the model\n"
        "  --logits-out FILE     also write the prompt's logits (T x vocab, full forward) as JSON, for\n"
        "                        comparison with other implementations (tests/reference/check_hf_load.py)\n");
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

// Tokenizer search: explicit flag, then the model directory, then the training data's tokenizer
// recorded in the checkpoint's trainer_state.json.
static int load_tokenizer(sl_tokenizer **tok, const char *flag, const char *model_dir) {
    if (flag[0]) return sl_tokenizer_load_dir(tok, flag);
    char p[4400];
    static const char *const names[] = {"tokenizer.json", "vocab.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", model_dir, names[i]);
        if (file_exists(p)) return sl_tokenizer_load_dir(tok, model_dir);
    }
    snprintf(p, sizeof p, "%s/trainer_state.json", model_dir);
    cJSON *root = NULL;
    if (file_exists(p) && !(root = sl_json_read_strict(p))) return -1;
    const cJSON *cfg = root ? cJSON_GetObjectItemCaseSensitive(root, "client_state") : NULL;
    cfg = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "config") : NULL;
    cfg = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "shardlm") : NULL;
    const cJSON *tk = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "tokenizer") : NULL;
    const cJSON *data = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "data") : NULL;
    int rc;
    if (cJSON_IsString(tk)) rc = sl_tokenizer_load_dir(tok, tk->valuestring);
    else if (cJSON_IsString(data)) {
        snprintf(p, sizeof p, "%s/tokenizer", data->valuestring);
        rc = sl_tokenizer_load_dir(tok, p);
    } else {
        rc = sl_errorf("%s: no tokenizer found (pass --tokenizer DIR with tokenizer.json, or vocab.json and "
                       "merges.txt)", model_dir);
    }
    cJSON_Delete(root);
    return rc;
}

// --stop-at-eot's ids besides the tokenizer's eos: every eos_token_id (an integer or a list) of DIR/NAME,
// as transformers' generate stops on each (LLaMA 3 Instruct: <|end_of_text|> and <|eot_id|>). A missing
// file adds nothing; a malformed one is an error naming it; an id past the vocabulary, a warning.
enum { MAX_STOP_IDS = 16 };
static int eos_ids_from(const char *dir, const char *name, int vocab, int *ids, int *n) {
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (!file_exists(p)) return 0;
    cJSON *root = sl_json_read_strict(p);
    if (!root) return -1;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    int rc = 0;
    for (const cJSON *e = cJSON_IsArray(v) ? v->child : v; e && rc == 0; e = cJSON_IsArray(v) ? e->next : NULL) {
        if (cJSON_IsNull(e)) continue;
        if (!cJSON_IsNumber(e) || e->valuedouble != (double)e->valueint || e->valueint < 0)
            rc = sl_errorf("%s: eos_token_id: expected token ids (an integer or a list of them)", p);
        else if (e->valueint >= vocab)  // transformers accepts it too: such a token is never sampled
            fprintf(stderr, "warning: %s: eos_token_id %d is outside the vocabulary [0, %d); ignored\n", p,
                    e->valueint, vocab);
        else if (*n < MAX_STOP_IDS)
            ids[(*n)++] = e->valueint;
    }
    cJSON_Delete(root);
    return rc;
}

// Full forward over the prompt; writes {"input_ids": [...], "logits": [[...V...] x T]} atomically.
static int write_prompt_logits(sl_model *m, const int *ids, int n, const char *path) {
    int V = m->cfg.vocab_size;
    float *logits = sl_malloc((size_t)n * V * sizeof(float), "prompt logits");
    if (!logits || sl_model_forward(m, ids, NULL, 1, n, NULL) || sl_model_logits(m, 0, n, logits)) {
        free(logits);
        return -1;
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddItemToObject(root, "input_ids", cJSON_CreateIntArray(ids, n));
    cJSON *rows = cJSON_AddArrayToObject(root, "logits");
    for (int t = 0; t < n; t++) cJSON_AddItemToArray(rows, cJSON_CreateFloatArray(logits + (size_t)t * V, V));
    free(logits);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text) return sl_errorf("out of memory writing %s", path);
    int rc = sl_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

// --dtype's value -> SL_PRECISION_FP32 / BF16; -1 with a message naming the flag otherwise.
static int parse_dtype(const char *v) {
    if (!strcmp(v, "fp32") || !strcmp(v, "float32")) return SL_PRECISION_FP32;
    if (!strcmp(v, "bf16") || !strcmp(v, "bfloat16")) return SL_PRECISION_BF16;
    return sl_errorf("--dtype: expected fp32 (float32) or bf16 (bfloat16), got '%s'", v);
}

// "1,2,3" -> ids (at most cap, each in [0, vocab)); -1 with a message naming the flag otherwise.
static int parse_ids(const char *list, int vocab, int *ids, int cap, int *n) {
    *n = 0;
    for (const char *p = list; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= vocab || *n >= cap || (*end && *end != ','))
            return sl_errorf("--prompt-ids: expected at most %d comma-separated token ids in [0, %d), got \"%s\"", cap,
                             vocab, list);
        ids[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return *n ? 0 : sl_errorf("--prompt-ids: no token ids given");
}

// The model and its weights: a quantised base (quant_base.h: only codes and block statistics for the
// linears, computed through sl_ops_cpu_quant, or on bf16 tiles with --dtype bf16) when the directory is
// a bitsandbytes model or --quantize asks for one, else the full-precision model.
static int load_model(sl_model *m, sl_quant_base *qb, const sl_model_source *src, const sl_ops *ops,
                      const sl_quant_config *want) {
    int quantised = sl_quant_base_wanted(src, want, NULL);
    if (quantised < 0) return -1;
    if (quantised && ops->on_device)
        return sl_errorf("%s: quantised linears run only on the CPU (sl_ops_cpu_quant); use --device cpu, or a "
                         "full-precision model without --quantize on %s", src->weights_dir, ops->name);
    if (!quantised) {
        if (sl_model_create(m, &src->cfg, ops)) return -1;
        // read into host memory; a GPU model's parameters are then uploaded once
        size_t bytes = m->layout.total * sizeof(float);
        float *host = ops->on_device ? sl_malloc(bytes, "weights (host staging)") : m->params;
        int rc = host ? sl_hf_load(src->weights_dir, &m->layout, host) : -1;
        if (!rc && host != m->params) ops->upload(m->params, host, bytes);
        if (host != m->params) free(host);
        if (!rc) return 0;
        sl_model_free(m);
        return -1;
    }
    if (sl_quant_base_create(qb, m, src, want, ops, 0)) return -1;
    char desc[96];
    fprintf(stderr, "quantised linears: %s, %.2f MB (%.2f MB in fp32); full-precision tensors %.2f MB\n",
            sl_quant_config_describe(&qb->qm.qc, desc, sizeof desc), (double)sl_quant_base_bytes(qb) / 1e6,
            (double)qb->full_bytes / 1e6, (double)m->layout.total * sizeof(float) / 1e6);
    return 0;
}

int cmd_generate(int argc, char **argv) {
    char model_spec[4096] = "runs/demo", tok_dir[4096] = "", prompt[65536] = "", logits_out[4096] = "";
    char prompt_id_list[65536] = "", dtype[32] = "fp32", adapter[4096] = "", device[64] = "cpu";
    int max_new = 128, threads = 0, seed = 0, stop_eot = 0, have_prompt = 0, no_verify = 0;
    sl_sampler_config sc = {0.8f, 40, 0.95f};
    sl_quant_config want;
    sl_quant_config_default(&want);
    sl_args a = {argc, argv, 1, NULL, 0};
    for (; a.i < argc && !a.error; a.i++) {
        if (!strcmp(argv[a.i], "--help") || !strcmp(argv[a.i], "-h")) { usage(stdout); return 0; }
        if (sl_arg_str(&a, "--model", model_spec, sizeof model_spec)) continue;
        if (sl_arg_str(&a, "--checkpoint", model_spec, sizeof model_spec)) continue;
        if (sl_arg_str(&a, "--tokenizer", tok_dir, sizeof tok_dir)) continue;
        if (sl_arg_str(&a, "--prompt", prompt, sizeof prompt)) { have_prompt = 1; continue; }
        if (sl_arg_str(&a, "--prompt-ids", prompt_id_list, sizeof prompt_id_list)) continue;
        if (sl_arg_int(&a, "--max-new-tokens", 0, SL_NO_MAX, &max_new)) continue;
        if (sl_arg_float(&a, "--temperature", 0, SL_FLOAT_MAX, 0, &sc.temperature)) continue;
        if (sl_arg_int(&a, "--top-k", 0, SL_NO_MAX, &sc.top_k)) continue;
        if (sl_arg_float(&a, "--top-p", 0, 1, SL_OPEN_LO, &sc.top_p)) continue;
        if (sl_arg_int(&a, "--seed", 0, SL_NO_MAX, &seed)) continue;
        if (sl_arg_int(&a, "--threads", 0, SL_NO_MAX, &threads)) continue;
        if (sl_arg_str(&a, "--device", device, sizeof device)) continue;
        if (sl_arg_switch(&a, "--stop-at-eot")) { stop_eot = 1; continue; }
        if (sl_arg_switch(&a, "--no-verify")) { no_verify = 1; continue; }
        if (sl_arg_str(&a, "--logits-out", logits_out, sizeof logits_out)) continue;
        if (sl_arg_str(&a, "--adapter", adapter, sizeof adapter)) continue;
        char qflag[16];
        if (sl_arg_str(&a, "--quantize", qflag, sizeof qflag)) {
            if (sl_quant_config_from_flag(qflag, &want)) { fprintf(stderr, "error: %s\n", sl_error()); return 2; }
            continue;
        }
        if (sl_arg_str(&a, "--dtype", dtype, sizeof dtype)) continue;
        if (sl_arg_str(&a, "--precision", dtype, sizeof dtype)) continue;
        fprintf(stderr, "error: unknown flag '%s' (see shardlm generate --help)\n", argv[a.i]);
        return 2;
    }
    if (a.error) return 2;
    int precision = parse_dtype(dtype);
    if (precision < 0) {
        fprintf(stderr, "error: %s\n", sl_error());
        return 2;
    }
    if (sl_ops_cpu_set_threads(threads)) {
        fprintf(stderr, "error: --threads: %s\n", sl_error());
        return 1;
    }
    // cuda: the GPU is initialised here; cpu stays sl_ops_cpu (the bf16 table is chosen below)
    const sl_ops *device_ops = strcmp(device, "cpu") ? sl_ops_for_device(device, 0) : &sl_ops_cpu;
    if (!device_ops) {
        fprintf(stderr, "error: %s\n", sl_error());
        return 2;
    }
    sl_model_source src;
    sl_model m;
    sl_lora lora;
    memset(&lora, 0, sizeof lora);
    sl_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    int *prompt_ids = NULL, *new_ids = NULL, rc = -1, have_model = 0, from_ids = prompt_id_list[0] != 0;
    sl_quant_base qb = {0};
    if (from_ids && have_prompt) { fprintf(stderr, "error: give --prompt or --prompt-ids, not both\n"); return 2; }
    if (sl_model_source_resolve(&src, model_spec)) goto done;
    if (!src.has_weights) { sl_errorf("%s: generation needs trained weights (a checkpoint or HF directory)", model_spec); goto done; }
    const sl_ops *ops = sl_ops_for_precision(device_ops, precision);
    if (!no_verify && sl_manifest_verify_weights_dir(src.weights_dir)) goto done;
    // the weights (quantised ones through sl_ops_cpu_quant), then their bf16 copy (made by
    // sl_model_attach_lora when an adapter is attached); then only what the forward reads is kept
    if (load_model(&m, &qb, &src, ops, &want)) goto done;
    have_model = 1;
    if (adapter[0] ? sl_peft_load(adapter, &src.cfg, m.ops, &lora) || sl_model_attach_lora(&m, &lora)
                   : sl_model_params_changed(&m))
        goto done;
    if (sl_model_for_inference(&m)) goto done;
    if (load_tokenizer(&tok, tok_dir, src.weights_dir)) {
        if (!from_ids || tok_dir[0]) goto done;
        tok = NULL;  // token ids in, token ids out
    }
    if (tok && sl_tokenizer_check_model_vocab(tok, tok_dir[0] ? tok_dir : "found for the model", src.cfg.vocab_size,
                                              model_spec, 1))
        goto done;
    size_t n = 0;
    if (have_prompt && prompt[0]) {
        if (sl_tokenizer_encode_special(tok, prompt, strlen(prompt), &ids, &n)) goto done;
    }
    int n_prompt = n > 0 ? (int)n : 1;
    if (from_ids) n_prompt = (int)(strlen(prompt_id_list) / 2 + 1);
    prompt_ids = malloc(sizeof(int) * (size_t)n_prompt);
    if (!prompt_ids) { sl_errorf("out of memory"); goto done; }
    if (from_ids) {
        if (parse_ids(prompt_id_list, src.cfg.vocab_size, prompt_ids, n_prompt, &n_prompt)) goto done;
    } else if (n > 0) {
        for (size_t i = 0; i < n; i++) prompt_ids[i] = ids[i];
    } else {
        prompt_ids[0] = tok && sl_tokenizer_bos_id(tok) >= 0   ? sl_tokenizer_bos_id(tok)
                        : tok && sl_tokenizer_eot_id(tok) >= 0 ? sl_tokenizer_eot_id(tok) : 0;
    }
    int stop_ids[MAX_STOP_IDS], n_stop = 0;
    if (stop_eot && src.cfg.eos_token_id >= 0) stop_ids[n_stop++] = src.cfg.eos_token_id;
    if (stop_eot && (eos_ids_from(src.weights_dir, "config.json", src.cfg.vocab_size, stop_ids, &n_stop) ||
                     eos_ids_from(src.weights_dir, "generation_config.json", src.cfg.vocab_size, stop_ids, &n_stop)))
        goto done;
    sl_generate_config gc = {max_new, sc, (uint64_t)seed, stop_eot, stop_ids, n_stop};
    int ctx = sl_config_context(&src.cfg);
    if (n_prompt > ctx) { sl_errorf("the prompt (%d tokens) is longer than the model's %d positions", n_prompt, ctx); goto done; }
    if (max_new == 0 && !logits_out[0]) { sl_errorf("--max-new-tokens 0 generates nothing: give --logits-out too"); goto done; }
    if (max_new > ctx - n_prompt) {
        // a prompt that fills every position still has logits (--logits-out), just no room to sample
        gc.max_new_tokens = ctx - n_prompt;
        if (gc.max_new_tokens < 1 && !logits_out[0]) { sl_errorf("the prompt (%d tokens) fills the model's %d positions", n_prompt, ctx); goto done; }
        fprintf(stderr, "note: max-new-tokens clipped to %d by the model's %d positions\n", gc.max_new_tokens, ctx);
    }
    if (logits_out[0] && write_prompt_logits(&m, prompt_ids, n_prompt, logits_out)) goto done;
    if (have_prompt) fputs(prompt, stdout);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int produced = 0;
    if (!tok && !(new_ids = malloc(sizeof(int) * (size_t)(gc.max_new_tokens + 1)))) { sl_errorf("out of memory"); goto done; }
    if (gc.max_new_tokens > 0 && sl_generate(&m, tok, prompt_ids, n_prompt, &gc, new_ids, &produced, stdout)) goto done;
    for (int i = 0; !tok && i < produced; i++) printf("%s%d", i ? " " : "", new_ids[i]);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("\n");
    fflush(stdout);
    fprintf(stderr, "[%d tokens in %.2f s, %.1f tokens/s; %s weights, %s ops]\n", produced, secs,
            produced / (secs > 0 ? secs : 1), m.ops->act_bf16 ? "bf16" : "fp32", m.ops->name);
    rc = 0;
done:
    if (rc) fprintf(stderr, "error: %s\n", sl_error());
    free(ids);
    free(prompt_ids);
    free(new_ids);
    sl_tokenizer_free(tok);
    if (have_model) sl_model_free(&m);
    sl_lora_free(&lora);
    sl_quant_base_free(&qb);
    return rc ? 1 : 0;
}
