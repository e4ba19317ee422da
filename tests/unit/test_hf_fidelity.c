// test_hf_fidelity.c: shardlm against transformers 5 on the tiny models of tests/fixtures/hf5 (made by
// tests/reference/make_hf5_fixtures.py: non-default values for every numeric key, each RoPE type,
// Qwen2 and Mistral, a 4.x-layout config). For each fixture: logits of a 24-token forward within 1e-4
// relative, 32 greedy tokens through the KV cache identical, config.json written back and read again
// describes the same model; and every refused setting is refused with its key named.
#include "test.h"

#include "shardlm/error.h"
#include "shardlm/hf_weights.h"
#include "shardlm/kv_cache.h"

#include <cjson/cJSON.h>
#include <dirent.h>

#define FIXTURES "tests/fixtures/hf5"

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) { free(s); s = NULL; }
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

static int int_list(const cJSON *arr, int *out, int cap) {
    int n = 0;
    for (const cJSON *it = arr ? arr->child : NULL; it && n < cap; it = it->next) out[n++] = it->valueint;
    return n;
}

static int check_fixture(const char *name) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, FIXTURES "/%s", name);
    snprintf(path, sizeof path, "%s/expected.json", dir);
    char *text = read_all(path);
    CHECK_MSG(text != NULL, "%s: no expected.json", name);
    if (!text) return 0;
    cJSON *exp = cJSON_Parse(text);
    free(text);
    sl_model_config cfg;
    sl_model m;
    int ok = sl_hf_load_config(dir, &cfg) == 0 && sl_model_create(&m, &cfg, &sl_ops_cpu) == 0;
    CHECK_MSG(ok, "%s: %s", name, sl_error());
    if (!ok) { cJSON_Delete(exp); return 0; }
    CHECK_MSG(sl_hf_load(dir, &m.layout, m.params) == 0, "%s: %s", name, sl_error());
    sl_model_params_changed(&m);

    // logits of the full forward
    int ids[64], T = int_list(cJSON_GetObjectItem(exp, "input_ids"), ids, 64);
    float *full = malloc((size_t)T * cfg.vocab_size * sizeof(float));
    CHECK_MSG(sl_model_forward(&m, ids, NULL, 1, T, NULL) == 0 && sl_model_logits(&m, 0, T, full) == 0, "%s: %s",
              name, sl_error());
    const cJSON *rows = cJSON_GetObjectItem(exp, "logits");
    double worst = 0;
    int t = 0;
    for (const cJSON *row = rows ? rows->child : NULL; row; row = row->next, t++) {
        int v = 0;
        for (const cJSON *x = row->child; x; x = x->next, v++) {
            double want = x->valuedouble, got = full[(size_t)t * cfg.vocab_size + v];
            double err = fabs(got - want) / (fabs(want) > 1.0 ? fabs(want) : 1.0);
            if (err > worst) worst = err;
        }
        CHECK_MSG(v == cfg.vocab_size, "%s: expected.json row of %d logits, vocab %d", name, v, cfg.vocab_size);
    }
    CHECK_MSG(t == T && T > 0, "%s: %d logit rows for %d tokens", name, t, T);
    free(full);
    CHECK_MSG(worst < 1e-4, "%s: logits differ from transformers by %.3g (relative)", name, worst);
    fprintf(stderr, "  %s: logits within %.2g of transformers\n", name, worst);

    // greedy decoding through the KV cache: prompt, then 32 argmax tokens
    int prompt[16], want_ids[64];
    int np = int_list(cJSON_GetObjectItem(exp, "prompt_ids"), prompt, 16);
    int ng = int_list(cJSON_GetObjectItem(exp, "greedy_ids"), want_ids, 64);
    sl_kv_cache kv;
    CHECK_MSG(sl_kv_cache_init(&kv, &m, np + ng) == 0, "%s: %s", name, sl_error());
    const float *logits = NULL;
    int same = np > 0 && ng == 32, tok = 0;
    for (int i = 0; i < np && same; i++) same = sl_kv_cache_forward(&kv, prompt[i], &logits) == 0;
    for (int i = 0; i < ng && same; i++) {
        tok = 0;
        for (int v = 1; v < cfg.vocab_size; v++)
            if (logits[v] > logits[tok]) tok = v;
        if (tok != want_ids[i]) {
            fprintf(stderr, "  %s: greedy token %d is %d, transformers gives %d\n", name, i, tok, want_ids[i]);
            same = 0;
        }
        if (same && i + 1 < ng) same = sl_kv_cache_forward(&kv, tok, &logits) == 0;
    }
    CHECK_MSG(same, "%s: greedy generation differs from transformers", name);
    sl_kv_cache_free(&kv);

    // config.json as shardlm writes it reads back as the same model
    char *json = sl_config_to_json_text(&cfg);
    sl_model_config back;
    CHECK_MSG(json && sl_config_from_json_text(&back, json, "written config.json") == 0, "%s: %s", name, sl_error());
    CHECK_MSG(sl_config_compare(&back, &cfg, name) == 0, "%s", sl_error());
    free(json);
    sl_model_free(&m);
    cJSON_Delete(exp);
    return 1;
}

TEST(every_hf5_fixture_matches_transformers) {
    DIR *d = opendir(FIXTURES);
    CHECK_MSG(d != NULL, "no %s", FIXTURES);
    if (!d) return;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.' || strchr(e->d_name, '.')) continue;  // the fixture folders only
        n += check_fixture(e->d_name);
    }
    closedir(d);
    CHECK_MSG(n >= 12, "only %d fixtures checked", n);
}

// A LLaMA config.json with `extra` spliced into its top level.
static int parse_llama_with(const char *model_type, const char *extra, sl_model_config *cfg) {
    char text[2048];
    snprintf(text, sizeof text,
             "{\"model_type\": \"%s\", \"vocab_size\": 100, \"hidden_size\": 32, \"intermediate_size\": 40,"
             " \"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
             " \"max_position_embeddings\": 64%s%s}",
             model_type, extra[0] ? ", " : "", extra);
    return sl_config_from_json_text(cfg, text, "config.json");
}

static void check_refused(const char *model_type, const char *extra, const char *named) {
    sl_model_config cfg;
    int rc = parse_llama_with(model_type, extra, &cfg);
    CHECK_MSG(rc == -1, "accepted: %s", extra);
    if (rc == -1) CHECK_MSG(strstr(sl_error(), named) != NULL, "error for %s does not name %s: %s", extra, named, sl_error());
}

TEST(settings_that_change_numbers_are_refused_by_name) {
    check_refused("llama", "\"rope_parameters\": {\"rope_type\": \"longrope\", \"short_factor\": [1], \"long_factor\": [1]}",
                  "longrope");
    check_refused("llama", "\"rope_scaling\": {\"type\": \"su\", \"factor\": 2}", "su");
    check_refused("llama", "\"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 2.0, \"rope_theta\": 10000},"
                  " \"rope_scaling\": {\"type\": \"linear\", \"factor\": 4.0}", "rope_scaling");
    check_refused("llama", "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 500000}, \"rope_theta\": 10000",
                  "rope_theta");
    check_refused("llama", "\"rope_scaling\": {\"rope_type\": \"linear\", \"type\": \"dynamic\", \"factor\": 2}", "type");
    check_refused("llama", "\"rope_parameters\": {\"rope_type\": \"linear\"}", "factor");
    check_refused("llama", "\"rope_parameters\": {\"rope_type\": \"yarn\"}", "factor");
    check_refused("llama", "\"rope_parameters\": {\"rope_type\": \"llama3\", \"factor\": 8, \"high_freq_factor\": 4}",
                  "low_freq_factor");
    check_refused("llama", "\"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 0.5}", "factor");
    check_refused("llama", "\"partial_rotary_factor\": 0.5", "partial_rotary_factor");
    check_refused("llama", "\"rope_parameters\": {\"rope_type\": \"default\", \"partial_rotary_factor\": 0.25}",
                  "partial_rotary_factor");
    check_refused("llama", "\"attention_bias\": true", "attention_bias");
    check_refused("llama", "\"mlp_bias\": true", "mlp_bias");
    check_refused("llama", "\"hidden_act\": \"gelu\"", "hidden_act");
    check_refused("llama", "\"attention_dropout\": 0.1", "attention_dropout");
    check_refused("llama", "\"quantization_config\": {\"quant_method\": \"bitsandbytes\"}", "quantization_config");
    check_refused("llama", "\"quantization_config\": {\"load_in_4bit\": true, \"bnb_4bit_quant_type\": \"nf5\"}",
                  "bnb_4bit_quant_type");
    check_refused("llama", "\"sliding_window\": 16", "sliding_window");
    check_refused("llama", "\"pad_token_id\": 100", "pad_token_id");
    check_refused("llama", "\"head_dim\": 7", "head_dim");
    check_refused("qwen2", "\"layer_types\": [\"sliding_attention\"]", "use_sliding_window is false");
    check_refused("gemma", "", "gemma");
    check_refused("mistral", "\"sliding_window\": -4", "sliding_window");
    check_refused("llama", "\"rope_theta\": 10000, \"rope_theta\": 500000", "rope_theta");  // a key given twice
}

TEST(both_layouts_read_the_same_rope_settings) {
    sl_model_config a, b;
    CHECK(parse_llama_with("llama", "\"rope_theta\": 250000, \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}", &a) == 0);
    CHECK(parse_llama_with("llama", "\"rope_parameters\": {\"rope_type\": \"linear\", \"rope_theta\": 250000, \"factor\": 2}",
                           &b) == 0);
    CHECK(sl_config_compare(&a, &b, "4.x vs 5.x") == 0);
    CHECK(a.rope.type == SL_ROPE_LINEAR && a.rope.theta == 250000.0f && a.rope.factor == 2.0f);
    // the same settings in both places (as shardlm writes them) are accepted
    CHECK(parse_llama_with("llama", "\"rope_theta\": 250000, \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2},"
                           " \"rope_parameters\": {\"rope_type\": \"linear\", \"rope_theta\": 250000, \"factor\": 2}", &a) == 0);
    CHECK(sl_config_compare(&a, &b, "both") == 0);
    // llama3 / yarn: original_max_position_embeddings defaults to max positions, as transformers does
    CHECK(parse_llama_with("llama", "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4}", &a) == 0);
    CHECK(a.rope.original_max_position_embeddings == 64 && a.rope.truncate == 1);
    // qwen2 reads q/k/v biases; mistral its window; dynamic RoPE runs past max positions
    CHECK(parse_llama_with("qwen2", "", &a) == 0 && a.qkv_bias == 1 && a.sliding_window == 0);
    CHECK(parse_llama_with("mistral", "\"sliding_window\": 16", &a) == 0 && a.sliding_window == 16);
    CHECK(parse_llama_with("llama", "\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 4}", &a) == 0);
    CHECK(sl_config_context(&a) == 256);
}

// Settings read differently from transformers 5.24 before (found by comparing logits): the config
// classes' defaults for keys a file leaves out, Mistral's layer_types, and a value given only in
// rope_parameters when rope_scaling is there too (transformers then reads rope_scaling alone).
TEST(defaults_layer_types_and_two_rope_blocks_as_transformers_reads_them) {
    sl_model_config a;
    CHECK(parse_llama_with("mistral", "", &a) == 0 && a.sliding_window == 4096);   // MistralConfig's default
    CHECK(parse_llama_with("mistral", "\"sliding_window\": null", &a) == 0 && a.sliding_window == 0);
    CHECK(parse_llama_with("mistral", "\"sliding_window\": 8, \"layer_types\": [\"full_attention\"]", &a) == 0 &&
          a.sliding_window == 0);
    CHECK(parse_llama_with("mistral", "\"sliding_window\": 8, \"layer_types\": [\"sliding_attention\"]", &a) == 0 &&
          a.sliding_window == 8);
    const char *mixed = "{\"model_type\": \"mistral\", \"vocab_size\": 100, \"hidden_size\": 32, \"intermediate_size\": 40,"
                        " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"sliding_window\": 8,"
                        " \"layer_types\": [\"sliding_attention\", \"full_attention\"]}";
    CHECK(sl_config_from_json_text(&a, mixed, "config.json") == -1 && strstr(sl_error(), "layer_types mixes"));
    check_refused("mistral", "\"sliding_window\": null, \"layer_types\": [\"sliding_attention\"]", "layer_types");
    // Qwen2: the window only with use_sliding_window, on the layers from max_window_layers (default 28) on
    CHECK(parse_llama_with("qwen2", "\"use_sliding_window\": true, \"sliding_window\": 16", &a) == 0 &&
          a.sliding_window == 0);  // one layer, below max_window_layers: full attention, as transformers
    CHECK(parse_llama_with("qwen2", "\"use_sliding_window\": true, \"sliding_window\": 16, \"max_window_layers\": 0",
                           &a) == 0 && a.sliding_window == 16);
    CHECK(parse_llama_with("qwen2", "\"use_sliding_window\": true, \"max_window_layers\": 0", &a) == 0 &&
          a.sliding_window == 4096);  // Qwen2Config's default window
    CHECK(parse_llama_with("qwen2", "\"use_sliding_window\": false, \"sliding_window\": 16, \"max_window_layers\": 0",
                           &a) == 0 && a.sliding_window == 0);
    CHECK(parse_llama_with("qwen2", "\"use_sliding_window\": true, \"sliding_window\": 16, \"layer_types\": "
                           "[\"sliding_attention\"]", &a) == 0 && a.sliding_window == 16);
    const char *qwen_mixed = "{\"model_type\": \"qwen2\", \"vocab_size\": 100, \"hidden_size\": 32, \"intermediate_size\": 40,"
                             " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"use_sliding_window\": true,"
                             " \"sliding_window\": 8, \"max_window_layers\": 1}";
    CHECK(sl_config_from_json_text(&a, qwen_mixed, "config.json") == -1 && strstr(sl_error(), "max_window_layers mixes"));
    // written back as transformers reads it: the window on every layer
    CHECK(parse_llama_with("qwen2", "\"use_sliding_window\": true, \"sliding_window\": 16, \"max_window_layers\": 0",
                           &a) == 0);
    char *written = sl_config_to_json_text(&a);
    sl_model_config back;
    CHECK(written && sl_config_from_json_text(&back, written, "written") == 0 && back.sliding_window == 16);
    free(written);
    check_refused("mistral", "\"layer_types\": [\"full_attention\", \"full_attention\"]", "layer_types has 2");
    check_refused("llama", "\"layer_types\": [\"full_attention\", \"full_attention\"]", "layer_types has 2");
    const char *no_kv = "{\"model_type\": \"%s\", \"vocab_size\": 100, \"hidden_size\": 64, \"intermediate_size\": 40,"
                        " \"num_hidden_layers\": 1, \"num_attention_heads\": %d%s}";
    char text[512];
    struct { const char *type; int heads, kv; const char *extra; } kv[] = {
        {"mistral", 16, 8, ""}, {"qwen2", 32, 32, ""}, {"llama", 16, 16, ""}, {"mistral", 16, 16, ", \"num_key_value_heads\": null"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
        snprintf(text, sizeof text, no_kv, kv[i].type, kv[i].heads, kv[i].extra);
        CHECK_MSG(sl_config_from_json_text(&a, text, "config.json") == 0 && a.n_kv_head == kv[i].kv, "%s: %s", text,
                  sl_error());
    }
    check_refused("llama", "\"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 4, \"rope_theta\": 500000},"
                  " \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 4}", "only inside rope_parameters");
    check_refused("llama", "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4, "
                  "\"original_max_position_embeddings\": 16}, \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}",
                  "original_max_position_embeddings is given only inside rope_parameters");
    // given where transformers reads it too, the same value: accepted
    CHECK(parse_llama_with("llama", "\"rope_theta\": 500000, \"rope_parameters\": {\"rope_type\": \"linear\", "
                           "\"factor\": 4, \"rope_theta\": 500000}, \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 4}",
                           &a) == 0 && a.rope.theta == 500000.0f);
}

TEST(written_config_keeps_every_rope_setting) {
    sl_model_config a, b;
    CHECK(parse_llama_with("llama", "\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 20000, \"factor\": 4,"
                           " \"original_max_position_embeddings\": 16, \"beta_fast\": 16, \"beta_slow\": 2,"
                           " \"attention_factor\": 1.25, \"truncate\": false}, \"head_dim\": 16, \"pad_token_id\": 3",
                           &a) == 0);
    char *json = sl_config_to_json_text(&a);
    CHECK(json && strstr(json, "\"rope_parameters\"") && strstr(json, "\"rope_scaling\"") && strstr(json, "\"rope_theta\""));
    CHECK(sl_config_from_json_text(&b, json, "written") == 0);
    CHECK_MSG(sl_config_compare(&a, &b, "round trip") == 0, "%s", sl_error());
    CHECK(b.head_dim == 16 && b.n_head * b.head_dim == 64 && b.pad_token_id == 3);
    free(json);
}

// pad_token_id is nn.Embedding's padding_idx: its row starts at zero and the lookup gives it no gradient.
TEST(padding_row_gets_no_embedding_gradient) {
    sl_model_config cfg;
    CHECK(parse_llama_with("llama", "\"pad_token_id\": 3", &cfg) == 0);
    sl_model m;
    CHECK(sl_model_create(&m, &cfg, &sl_ops_cpu) == 0);
    sl_model_init_weights(&m, 7);
    const sl_tensor_info *wte = &m.layout.tensors[m.layout.wte];
    int C = cfg.n_embd, in[8] = {3, 5, 3, 9, 3, 1, 2, 3}, tg[8] = {5, 3, 9, 3, 1, 2, 3, 4};
    double row3 = 0, row5 = 0;
    for (int c = 0; c < C; c++) row3 += fabs(m.params[wte->offset + 3 * (size_t)C + c]);
    CHECK_MSG(row3 == 0.0, "padding row initialised to %g", row3);
    sl_model_zero_grad(&m);
    CHECK(sl_model_forward(&m, in, tg, 1, 8, NULL) == 0 && sl_model_backward(&m, 1.0f) == 0);
    row3 = 0;
    for (int c = 0; c < C; c++) {
        row3 += fabs(m.grads[wte->offset + 3 * (size_t)C + c]);
        row5 += fabs(m.grads[wte->offset + 5 * (size_t)C + c]);
    }
    CHECK_MSG(row3 == 0.0 && row5 > 0.0, "padding row gradient %g, row 5 %g", row3, row5);
    sl_model_free(&m);
}

// A GPT-2 config.json without n_inner whose n_embd is so large that 4 x n_embd overflows an int is
// refused naming n_embd (found by the hf_config fuzz target: a signed overflow before).
TEST(gpt2_n_embd_overflowing_n_inner_refused) {
    sl_model_config cfg;
    const char *text = "{\"model_type\":\"gpt2\",\"n_embd\":1544224792,\"n_head\":4,\"n_layer\":2,"
                       "\"n_positions\":64,\"vocab_size\":100}";
    CHECK(sl_config_from_json_text(&cfg, text, "config.json") == -1);
    CHECK_MSG(strstr(sl_error(), "n_embd 1544224792 is too large") != NULL, "%s", sl_error());
}

TEST_MAIN()
