// test_quant_model.c: models quantised by transformers + bitsandbytes (tests/fixtures/quant/*, from
// tests/reference/make_quant_model_fixtures.py) load with bitsandbytes' logits; quantising the fp32
// models ourselves writes their files byte for byte; corrupt files are refused with nothing written.
#include "test.h"

#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/hf_weights.h"
#include "shardlm/model.h"
#include "shardlm/quant_model.h"
#include "shardlm/quant_state.h"
#include "shardlm/safetensors.h"

#include <stdint.h>
#include <unistd.h>

#define FX "tests/fixtures/quant"

static float *ref_logits(const char *name, int *T, int *V, int64_t *ids) {
    sl_st_file f;
    if (sl_st_open(&f, FX "/models_ref.safetensors")) return NULL;
    char key[64];
    snprintf(key, sizeof key, "%s.logits", name);
    int i = sl_st_find(&f, key), k = sl_st_find(&f, "input_ids");
    float *out = NULL;
    if (i >= 0 && k >= 0 && f.tensors[k].numel <= 64) {
        *T = (int)f.tensors[i].shape[0];
        *V = (int)f.tensors[i].shape[1];
        out = malloc(f.tensors[i].numel * sizeof(float));
        if (sl_st_read_f32(&f, i, out, f.tensors[i].numel) || sl_st_read_raw(&f, k, ids, 64 * 8)) { free(out); out = NULL; }
    }
    sl_st_close(&f);
    return out;
}

// Loads DIR (quantised, or fp32 quantised with `want`) and compares its logits with the reference.
static void check_logits(const char *name, const sl_quant_config *want, double tol) {
    char dir[256];
    snprintf(dir, sizeof dir, FX "/%s", name);
    int T, V;
    int64_t ids64[64];
    float *ref = ref_logits(name, &T, &V, ids64);
    CHECK(ref != NULL);
    if (!ref) return;
    sl_model_config cfg;
    sl_model m;
    CHECK_MSG(sl_hf_load_config(dir, &cfg) == 0, "%s", sl_error());
    CHECK_MSG(sl_model_create(&m, &cfg, &sl_ops_cpu) == 0, "%s", sl_error());
    sl_quant_model qm;
    int quantised = 0;
    CHECK_MSG(sl_quant_model_load_any(&qm, dir, &m.layout, m.params, want, &quantised) == 0, "%s: %s", name,
              sl_error());
    sl_quant_ops_entry e[64];
    int n = 0;
    if (quantised) {
        CHECK(sl_quant_model_linears(&qm, &m.layout, m.params, e, &n) == 0 && n == 4 * cfg.n_layer);
        CHECK(sl_quant_ops_install(e, n) == 0);
        m.ops = &sl_ops_cpu_quant;
    }
    int ids[64];
    for (int t = 0; t < T; t++) ids[t] = (int)ids64[t];
    float *got = malloc((size_t)T * V * sizeof(float));
    CHECK(sl_model_forward(&m, ids, NULL, 1, T, NULL) == 0 && sl_model_logits(&m, 0, T, got) == 0);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < (size_t)T * V; i++) {
        worst = fmax(worst, fabs(got[i] - ref[i]));
        scale = fmax(scale, fabs(ref[i]));
    }
    CHECK_MSG(worst <= tol * scale, "%s: logits differ by %.3g (largest |logit| %.3g)", name, worst, scale);
    fprintf(stderr, "  %s%s: logits within %.2g of bitsandbytes (largest |logit| %.2g)\n", name,
            want->type != SL_QUANT_NONE ? " quantised on load" : "", worst, scale);
    sl_quant_ops_install(NULL, 0);
    sl_quant_model_free(&qm);
    sl_model_free(&m);
    free(got);
    free(ref);
}

static sl_quant_config none(void) {
    sl_quant_config qc;
    sl_quant_config_default(&qc);
    return qc;
}

TEST(bitsandbytes_files_give_bitsandbytes_logits) {
    sl_quant_config qc = none();
    // bitsandbytes' own forward dequantises and multiplies in fp32 as we do: 1e-5 of the largest logit
    check_logits("llama_nf4", &qc, 1e-5);
    check_logits("llama_fp4", &qc, 1e-5);
    check_logits("llama_int8", &qc, 1e-5);
    check_logits("gpt2_nf4", &qc, 1e-5);
    check_logits("llama_fp32", &qc, 1e-5);
    check_logits("gpt2_fp32", &qc, 1e-5);
}

// Every tensor of file a is in file b with the same dtype, shape and bytes, and the counts agree.
static void same_tensors(const char *a, const char *b) {
    sl_st_file fa, fb;
    CHECK_MSG(sl_st_open(&fa, a) == 0, "%s", sl_error());
    CHECK_MSG(sl_st_open(&fb, b) == 0, "%s", sl_error());
    CHECK(fa.n_tensors == fb.n_tensors);
    int bad = 0;
    for (int i = 0; i < fa.n_tensors; i++) {
        const sl_st_tensor *t = &fa.tensors[i];
        int j = sl_st_find(&fb, t->name);
        if (j < 0 || fb.tensors[j].dtype != t->dtype || fb.tensors[j].ndim != t->ndim ||
            memcmp(fb.tensors[j].shape, t->shape, sizeof(int64_t) * (size_t)t->ndim)) {
            if (!bad++) fprintf(stderr, "  %s: tensor %s missing or of another dtype / shape in %s\n", a, t->name, b);
            continue;
        }
        size_t bytes = t->end - t->begin;
        char *x = malloc(bytes + 1), *y = malloc(bytes + 1);
        if (sl_st_read_raw(&fa, i, x, bytes) || sl_st_read_raw(&fb, j, y, bytes) || memcmp(x, y, bytes)) {
            if (!bad++) fprintf(stderr, "  %s: tensor %s differs\n", b, t->name);
        }
        free(x);
        free(y);
    }
    CHECK_MSG(bad == 0, "%d tensors of %s differ in %s", bad, a, b);
    sl_st_close(&fa);
    sl_st_close(&fb);
}

static void quantise_and_save(const char *src, const char *flag, int double_quant, const char *expect_dir) {
    char sdir[256], tmp[] = "/tmp/shardlm_quant_model_XXXXXX", out[300], a[400], b[400];
    snprintf(sdir, sizeof sdir, FX "/%s", src);
    CHECK(mkdtemp(tmp) != NULL);
    snprintf(out, sizeof out, "%s/out", tmp);
    sl_model_config cfg;
    sl_param_layout L;
    CHECK(sl_hf_load_config(sdir, &cfg) == 0 && sl_layout_build(&L, &cfg) == 0);
    float *params = calloc(L.total, sizeof(float));
    sl_quant_config want;
    CHECK(sl_quant_config_from_flag(flag, &want) == 0);
    want.double_quant = double_quant;
    sl_quant_model qm;
    int quantised;
    CHECK_MSG(sl_quant_model_load_any(&qm, sdir, &L, params, &want, &quantised) == 0 && quantised, "%s",
              sl_error());
    CHECK_MSG(sl_quant_model_save(out, &qm, &L, params) == 0, "%s", sl_error());
    snprintf(a, sizeof a, FX "/%s/model.safetensors", expect_dir);
    snprintf(b, sizeof b, "%s/model.safetensors", out);
    same_tensors(a, b);
    // what we wrote loads back to the same quantised tensors
    sl_quant_model back;
    float *p2 = calloc(L.total, sizeof(float));
    CHECK_MSG(sl_quant_model_load(&back, out, &L, p2) == 0, "%s", sl_error());
    CHECK(memcmp(params, p2, L.total * sizeof(float)) == 0);
    for (int t = 0; t < L.n_tensors && back.q; t++) {
        const sl_qtensor *x = &qm.q[t], *y = &back.q[t];
        CHECK(x->type == y->type);
        if (x->type != SL_QUANT_NONE) CHECK(sl_qtensor_bytes(x) == sl_qtensor_bytes(y));
        if (x->type != SL_QUANT_NONE) CHECK(memcmp(x->data, y->data, x->type == SL_QUANT_INT8 ? x->numel : (x->numel + 1) / 2) == 0);
    }
    sl_quant_model_free(&back);
    sl_quant_model_free(&qm);
    free(params);
    free(p2);
    sl_layout_free(&L);
    sl_remove_tree(tmp);
}

TEST(quantising_fp32_models_writes_bitsandbytes_files_byte_for_byte) {
    quantise_and_save("llama_fp32", "nf4", 1, "llama_nf4");
    quantise_and_save("llama_fp32", "fp4", 0, "llama_fp4");
    quantise_and_save("llama_fp32", "int8", 0, "llama_int8");
    quantise_and_save("gpt2_fp32", "nf4", 1, "gpt2_nf4");
}

TEST(quantising_on_load_gives_bitsandbytes_logits) {
    sl_quant_config qc;
    sl_quant_config_from_flag("nf4", &qc);
    check_logits("llama_nf4", &qc, 1e-5);   // llama_nf4 is already quantised: --quantize nf4 agrees with it
    CHECK(sl_quant_config_from_flag("int8", &qc) == 0);
    sl_quant_model qm;
    sl_model_config cfg;
    sl_param_layout L;
    CHECK(sl_hf_load_config(FX "/llama_nf4", &cfg) == 0 && sl_layout_build(&L, &cfg) == 0);
    float *params = calloc(L.total, sizeof(float));
    int q;
    CHECK(sl_quant_model_load_any(&qm, FX "/llama_nf4", &L, params, &qc, &q) == -1);
    CHECK(strstr(sl_error(), "already quantised as nf4") != NULL);
    free(params);
    sl_layout_free(&L);
}

// ---------------------------------------------------------------- bad input

typedef struct { const char *name; const char *replace_with; int drop; } edit;

// Copies llama_nf4 into a new directory, the tensor `e.name` replaced by the bytes of e.replace_with
// (U8 text) or dropped; config.json's text edited by replacing `from` with `to` when given.
static void write_variant(const char *dir, edit e, const char *from, const char *to) {
    sl_st_file f;
    CHECK(sl_st_open(&f, FX "/llama_nf4/model.safetensors") == 0);
    sl_st_desc *d = calloc((size_t)f.n_tensors, sizeof *d);
    sl_st_dtype *dt = calloc((size_t)f.n_tensors, sizeof *dt);
    void **data = calloc((size_t)f.n_tensors, sizeof *data);
    size_t *bytes = calloc((size_t)f.n_tensors, sizeof *bytes);
    int n = 0;
    for (int i = 0; i < f.n_tensors; i++) {
        const sl_st_tensor *t = &f.tensors[i];
        int hit = strcmp(t->name, e.name) == 0;
        if (hit && e.drop) continue;
        d[n].name = t->name;
        d[n].ndim = t->ndim;
        memcpy(d[n].shape, t->shape, sizeof t->shape);
        dt[n] = t->dtype;
        bytes[n] = t->end - t->begin;
        data[n] = malloc(bytes[n] + 1);
        sl_st_read_raw(&f, i, data[n], bytes[n]);
        if (hit && e.replace_with) {
            free(data[n]);
            data[n] = strdup(e.replace_with);
            bytes[n] = strlen(e.replace_with);
            d[n].shape[0] = (int64_t)bytes[n];
        } else if (hit) {
            ((unsigned char *)data[n])[0] ^= 0x40;   // flip a bit of the first element
        }
        n++;
    }
    char path[300];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    sl_st_writer *w;
    CHECK(sl_st_writer_open_dtypes(&w, path, n, d, dt, 0, NULL, NULL) == 0);
    for (int i = 0; i < n; i++) CHECK(sl_st_writer_write_raw(w, data[i], bytes[i]) == 0);
    CHECK(sl_st_writer_finish(w) == 0);
    for (int i = 0; i < n; i++) free(data[i]);
    free(d); free(dt); free(data); free(bytes);
    sl_st_close(&f);
    char *cfg = sl_read_text_file(FX "/llama_nf4/config.json", NULL);
    CHECK(cfg != NULL);
    if (!cfg) return;
    char *text = cfg;
    char edited[8192];
    if (from) {
        char *at = strstr(cfg, from);
        CHECK(at != NULL);
        if (at) {
            snprintf(edited, sizeof edited, "%.*s%s%s", (int)(at - cfg), cfg, to, at + strlen(from));
            text = edited;
        }
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK(sl_write_file_atomic(path, text, strlen(text)) == 0);
    free(cfg);
}

static void expect_refused(edit e, const char *from, const char *to, const char *message) {
    char tmp[] = "/tmp/shardlm_quant_bad_XXXXXX";
    CHECK(mkdtemp(tmp) != NULL);
    write_variant(tmp, e, from, to);
    sl_model_config cfg;
    sl_param_layout L;
    CHECK(sl_hf_load_config(FX "/llama_nf4", &cfg) == 0 && sl_layout_build(&L, &cfg) == 0);
    float *params = malloc(L.total * sizeof(float));
    for (size_t i = 0; i < L.total; i++) params[i] = 1.5f;   // must stay untouched
    sl_quant_model qm;
    int rc = sl_quant_model_load(&qm, tmp, &L, params);
    CHECK_MSG(rc == -1, "%s: loaded although %s", e.name, message);
    CHECK_MSG(strstr(sl_error(), message) != NULL, "expected \"%s\" in: %s", message, sl_error());
    CHECK(qm.q == NULL);
    size_t changed = 0;
    for (size_t i = 0; i < L.total; i++) changed += params[i] != 1.5f;
    CHECK_MSG(changed == 0, "%zu parameters written by a failed load", changed);
    free(params);
    sl_layout_free(&L);
    sl_remove_tree(tmp);
}

#define QS "model.layers.1.mlp.up_proj.weight.quant_state.bitsandbytes__nf4"

TEST(corrupt_files_are_refused_and_nothing_is_written) {
    static const char *const states[][2] = {   // the quant_state text, the message it must get
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64", "unexpected end of input"},
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [96, 32], \"nested_blocksize\": "
         "256, \"nested_dtype\": \"float32\", \"nested_offset\": 0.05}",
         "shape [96, 32], the model's model.layers.1.mlp.up_proj.weight is [128, 64]"},
        {"{\"quant_type\": \"nf4\", \"blocksize\": 48, \"dtype\": \"float32\", \"shape\": [128, 64]}", "blocksize 48"},
        {"{\"quant_type\": \"nf5\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [128, 64]}",
         "quant_type \"nf5\" is unknown"},
        {"{\"quant_type\": \"fp4\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [128, 64], \"nested_blocksize\": "
         "256, \"nested_dtype\": \"float32\", \"nested_offset\": 0.05}", "disagrees with the tensor's name"},
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [128, 64], \"nested_blocksize\": "
         "256, \"nested_dtype\": \"float32\", \"nested_offset\": 0.05, \"x\": 1}", "unknown key(s) x"},
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [128, 64]}",
         "model.layers.1.mlp.up_proj.weight.absmax\": U8 with 128 elements, expected F32"},
    };
    for (size_t i = 0; i < sizeof states / sizeof states[0]; i++) {
        edit e = {QS, states[i][0], 0};
        expect_refused(e, NULL, NULL, states[i][1]);
    }
    edit map = {"model.layers.0.self_attn.q_proj.weight.quant_map", NULL, 0};
    expect_refused(map, NULL, NULL, "is not bitsandbytes' nf4 table");
    edit drop = {"model.layers.0.self_attn.k_proj.weight.nested_absmax", NULL, 1};
    expect_refused(drop, NULL, NULL, "\"model.layers.0.self_attn.k_proj.weight.nested_absmax\" is missing");
    edit codes = {"model.layers.0.self_attn.k_proj.weight", "short", 0};
    expect_refused(codes, NULL, NULL, "U8 with 5 elements, expected U8 with 1024");
    edit none = {"no such tensor", NULL, 0};
    expect_refused(none, "\"bnb_4bit_quant_type\": \"nf4\"", "\"bnb_4bit_quant_type\": \"nf3\"",
                   "bnb_4bit_quant_type \"nf3\" is unknown");
    expect_refused(none, "\"bnb_4bit_quant_type\": \"nf4\"", "\"bnb_4bit_quant_type\": \"fp4\"",
                   "the file holds the other 4-bit type than config.json says");
    expect_refused(none, "\"load_in_8bit\": false", "\"load_in_8bit\": true", "load_in_4bit and load_in_8bit");
}

TEST(nf4_refuses_a_model_whose_linears_are_not_whole_blocks) {
    sl_model_config cfg;
    CHECK(sl_config_preset(&cfg, "llama-tiny") == 0);
    cfg.n_embd = 36;          // q_proj 36 x 36 = 1296 elements: 20.25 blocks of 64
    cfg.n_head = cfg.n_kv_head = 2;
    cfg.head_dim = 18;
    CHECK_MSG(sl_config_validate(&cfg, "test") == 0, "%s", sl_error());
    sl_param_layout L;
    CHECK(sl_layout_build(&L, &cfg) == 0);
    float *params = malloc(L.total * sizeof(float));
    for (size_t i = 0; i < L.total; i++) params[i] = (float)(i % 17) * 0.01f;
    float *copy = malloc(L.total * sizeof(float));
    memcpy(copy, params, L.total * sizeof(float));
    sl_quant_config qc;
    sl_quant_config_from_flag("nf4", &qc);
    sl_quant_model qm;
    CHECK(sl_quant_model_quantize(&qm, &L, params, &qc, SL_QDT_F32) == -1);
    CHECK_MSG(strstr(sl_error(), "quantising model.layers.0.self_attn.q_proj.weight: nf4 quantisation: a [36, 36] "
                                 "tensor has 1296 elements, not a multiple of the block size 64") != NULL, "%s",
              sl_error());
    CHECK(qm.q == NULL);
    CHECK(memcmp(params, copy, L.total * sizeof(float)) == 0);
    sl_quant_config_from_flag("int8", &qc);   // int8 is per row: any shape
    CHECK(sl_quant_model_quantize(&qm, &L, params, &qc, SL_QDT_F32) == 0);
    sl_quant_model_free(&qm);
    free(params);
    free(copy);
    sl_layout_free(&L);
}

TEST(quant_state_json_and_python_float_repr) {
    char b[64];
    CHECK(strcmp(sl_python_float_repr(b, sizeof b, 0.05495791882276535), "0.05495791882276535") == 0);
    CHECK(strcmp(sl_python_float_repr(b, sizeof b, 1e-05), "1e-05") == 0);
    CHECK(strcmp(sl_python_float_repr(b, sizeof b, 120.0), "120.0") == 0);
    CHECK(strcmp(sl_python_float_repr(b, sizeof b, 0.1), "0.1") == 0);
    CHECK(strcmp(sl_python_float_repr(b, sizeof b, -2.5e-07), "-2.5e-07") == 0);
    CHECK(strcmp(sl_python_float_repr(b, sizeof b, 1e16), "1e+16") == 0);
    CHECK(strcmp(sl_python_float_repr(b, sizeof b, 123456789012345.6), "123456789012345.6") == 0);
    CHECK(strcmp(sl_python_float_repr(b, sizeof b, 0.0001), "0.0001") == 0);
    sl_qtensor q = {.type = SL_QUANT_FP4, .blocksize = 128, .dtype = SL_QDT_BF16, .rows = 3, .cols = 256};
    char *js = sl_quant_state_json(&q);
    CHECK(js && strcmp(js, "{\"quant_type\": \"fp4\", \"blocksize\": 128, \"dtype\": \"bfloat16\", \"shape\": [3, "
                           "256]}") == 0);
    sl_qtensor r = {0};
    CHECK(sl_quant_state_parse(js, strlen(js), &r, "test") == 0);
    CHECK(r.type == SL_QUANT_FP4 && r.blocksize == 128 && r.dtype == SL_QDT_BF16 && r.rows == 3 && r.cols == 256 &&
          !r.nested);
    free(js);
    const char *bad = "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [3, -1]}";
    CHECK(sl_quant_state_parse(bad, strlen(bad), &r, "qs") == -1 && strstr(sl_error(), "qs: \"shape\"") != NULL);
    bad = "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [3, 64], "
          "\"nested_blocksize\": 128, \"nested_dtype\": \"float32\", \"nested_offset\": 0.1}";
    CHECK(sl_quant_state_parse(bad, strlen(bad), &r, "qs") == -1 && strstr(sl_error(), "nested_blocksize") != NULL);
    bad = "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"int8\", \"shape\": [3, 64]}";
    CHECK(sl_quant_state_parse(bad, strlen(bad), &r, "qs") == -1 && strstr(sl_error(), "qs: dtype") != NULL);
}

TEST_MAIN()
