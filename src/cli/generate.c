// generate.c: `shardlm generate`: loads a checkpoint or Hugging Face directory and samples text with
// temperature, top-k and top-p through the KV cache, streaming tokens as they are produced.
#include "cli/args.h"
#include "cli/commands.h"
#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/generate.h"
#include "shardlm/hf_weights.h"
#include "shardlm/json_get.h"
#include "shardlm/manifest.h"
#include "shardlm/model_source.h"

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
        "  --tokenizer DIR       vocab.json + merges.txt (default: the model directory, else the tokenizer of\n"
        "                        the data the checkpoint was trained on)\n"
        "  --prompt TEXT         prompt (default: start from <|endoftext|>)\n"
        "  --max-new-tokens N    (default 128)\n"
        "  --temperature T       0 = greedy (default 0.8)\n"
        "  --top-k K             0 = off (default 40)\n"
        "  --top-p P             1 = off (default 0.95)\n"
        "  --seed S              (default 0)\n"
        "  --stop-at-eot         stop when <|endoftext|> is sampled\n"
        "  --threads N           CPU threads\n"
        "  --no-verify           load a checkpoint without checking its files' sizes and FNV-1a checksums\n"
        "                        against manifest.json (default: checked)\n"
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
    snprintf(p, sizeof p, "%s/vocab.json", model_dir);
    if (file_exists(p)) return sl_tokenizer_load_dir(tok, model_dir);
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
        rc = sl_errorf("%s: no tokenizer found (pass --tokenizer DIR with vocab.json and merges.txt)", model_dir);
    }
    cJSON_Delete(root);
    return rc;
}

// Full forward over the prompt; writes {"input_ids": [...], "logits": [[...V...] x T]} atomically.
static int write_prompt_logits(sl_model *m, const int *ids, int n, const char *path) {
    if (sl_model_forward(m, ids, NULL, 1, n, NULL)) return -1;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddItemToObject(root, "input_ids", cJSON_CreateIntArray(ids, n));
    cJSON *rows = cJSON_AddArrayToObject(root, "logits");
    for (int t = 0; t < n; t++)
        cJSON_AddItemToArray(rows, cJSON_CreateFloatArray(m->logits + (size_t)t * m->cfg.padded_vocab_size,
                                                          m->cfg.vocab_size));
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text) return sl_errorf("out of memory writing %s", path);
    int rc = sl_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

int cmd_generate(int argc, char **argv) {
    char model_spec[4096] = "runs/demo", tok_dir[4096] = "", prompt[65536] = "", logits_out[4096] = "";
    int max_new = 128, threads = 0, seed = 0, stop_eot = 0, have_prompt = 0, no_verify = 0;
    sl_sampler_config sc = {0.8f, 40, 0.95f};
    sl_args a = {argc, argv, 1, NULL, 0};
    for (; a.i < argc && !a.error; a.i++) {
        if (!strcmp(argv[a.i], "--help") || !strcmp(argv[a.i], "-h")) { usage(stdout); return 0; }
        if (sl_arg_str(&a, "--model", model_spec, sizeof model_spec)) continue;
        if (sl_arg_str(&a, "--checkpoint", model_spec, sizeof model_spec)) continue;
        if (sl_arg_str(&a, "--tokenizer", tok_dir, sizeof tok_dir)) continue;
        if (sl_arg_str(&a, "--prompt", prompt, sizeof prompt)) { have_prompt = 1; continue; }
        if (sl_arg_int(&a, "--max-new-tokens", &max_new)) continue;
        if (sl_arg_float(&a, "--temperature", &sc.temperature)) continue;
        if (sl_arg_int(&a, "--top-k", &sc.top_k)) continue;
        if (sl_arg_float(&a, "--top-p", &sc.top_p)) continue;
        if (sl_arg_int(&a, "--seed", &seed)) continue;
        if (sl_arg_int(&a, "--threads", &threads)) continue;
        if (sl_arg_switch(&a, "--stop-at-eot")) { stop_eot = 1; continue; }
        if (sl_arg_switch(&a, "--no-verify")) { no_verify = 1; continue; }
        if (sl_arg_str(&a, "--logits-out", logits_out, sizeof logits_out)) continue;
        fprintf(stderr, "error: unknown flag '%s' (see shardlm generate --help)\n", argv[a.i]);
        return 2;
    }
    if (a.error) return 2;
    if (max_new < 1 || !(sc.temperature >= 0) || sc.top_k < 0 || !(sc.top_p > 0 && sc.top_p <= 1)) {
        fprintf(stderr, "error: need --max-new-tokens >= 1, --temperature >= 0, --top-k >= 0, 0 < --top-p <= 1\n");
        return 2;
    }
    sl_ops_cpu_set_threads(threads);
    sl_model_source src;
    sl_model m;
    sl_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    int *prompt_ids = NULL, rc = -1, have_model = 0;
    if (sl_model_source_resolve(&src, model_spec)) goto done;
    if (!src.has_weights) { sl_errorf("%s: generation needs trained weights (a checkpoint or HF directory)", model_spec); goto done; }
    if (sl_model_create(&m, &src.cfg, &sl_ops_cpu)) goto done;
    have_model = 1;
    if (!no_verify && sl_manifest_verify_weights_dir(src.weights_dir)) goto done;
    if (sl_hf_load(src.weights_dir, &m.layout, m.params)) goto done;
    if (load_tokenizer(&tok, tok_dir, src.weights_dir)) goto done;
    if (sl_tokenizer_check_model_vocab(tok, tok_dir[0] ? tok_dir : "found for the model", src.cfg.vocab_size, model_spec)) goto done;
    size_t n = 0;
    if (have_prompt && prompt[0]) {
        if (sl_tokenizer_encode(tok, prompt, strlen(prompt), &ids, &n)) goto done;
    }
    int n_prompt = n > 0 ? (int)n : 1;
    prompt_ids = malloc(sizeof(int) * (size_t)n_prompt);
    if (!prompt_ids) { sl_errorf("out of memory"); goto done; }
    if (n > 0) for (size_t i = 0; i < n; i++) prompt_ids[i] = ids[i];
    else prompt_ids[0] = sl_tokenizer_eot_id(tok) >= 0 ? sl_tokenizer_eot_id(tok) : 0;
    sl_generate_config gc = {max_new, sc, (uint64_t)seed, stop_eot};
    if (max_new > src.cfg.max_seq_len - n_prompt) {
        gc.max_new_tokens = src.cfg.max_seq_len - n_prompt;
        if (gc.max_new_tokens < 1) { sl_errorf("the prompt (%d tokens) fills the model's %d positions", n_prompt, src.cfg.max_seq_len); goto done; }
        fprintf(stderr, "note: max-new-tokens clipped to %d by the model's %d positions\n", gc.max_new_tokens, src.cfg.max_seq_len);
    }
    if (logits_out[0] && write_prompt_logits(&m, prompt_ids, n_prompt, logits_out)) goto done;
    if (have_prompt) fputs(prompt, stdout);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int produced = 0;
    if (sl_generate(&m, tok, prompt_ids, n_prompt, &gc, NULL, &produced, stdout)) goto done;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("\n");
    fflush(stdout);
    fprintf(stderr, "[%d tokens in %.2f s, %.1f tokens/s]\n", produced, secs, produced / (secs > 0 ? secs : 1));
    rc = 0;
done:
    if (rc) fprintf(stderr, "error: %s\n", sl_error());
    free(ids);
    free(prompt_ids);
    sl_tokenizer_free(tok);
    if (have_model) sl_model_free(&m);
    return rc ? 1 : 0;
}
