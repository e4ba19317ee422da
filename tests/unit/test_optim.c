// test_optim.c: optimizers and clipping against torch (tests/fixtures/optim/optimizers.json, made by
// tests/reference/make_optim_fixtures.py), sharded sub-range steps, the layout decay mask, the
// DeepSpeed optimizer block parser, and the determinism of the gradient norm.
#include "test.h"

#include "shardlm/config.h"
#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/layout.h"
#include "shardlm/optim.h"
#include "shardlm/precision.h"
#include "shardlm/rng.h"

#include <cjson/cJSON.h>
#include <omp.h>

static cJSON *load_fixture(void) {
    char *text = sl_read_text_file("tests/fixtures/optim/optimizers.json", NULL);
    if (!text) { fprintf(stderr, "  %s\n", sl_error()); return NULL; }
    cJSON *root = cJSON_Parse(text);
    free(text);
    return root;
}

static float *floats(const cJSON *arr, size_t *n_out) {
    size_t n = (size_t)cJSON_GetArraySize(arr);
    float *x = malloc(n * sizeof *x);
    size_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) x[i++] = (float)v->valuedouble;
    if (n_out) *n_out = n;
    return x;
}

// Relative 1e-6, with an absolute floor of 1e-6 * (largest magnitude in the reference).
static int check_array(const char *what, const float *got, const cJSON *want_arr, size_t n) {
    size_t m;
    float *want = floats(want_arr, &m);
    int bad = 0;
    float scale = 0.0f;
    for (size_t i = 0; i < m; i++) scale = fmaxf(scale, fabsf(want[i]));
    if (m != n) { fprintf(stderr, "  %s: %zu values, expected %zu\n", what, m, n); bad = 1; }
    for (size_t i = 0; i < n && i < m && bad < 5; i++) {
        double tol = 1e-6 * fmax(fabs(want[i]), 1e-3 * scale);
        if (!(fabs((double)got[i] - want[i]) <= tol)) {
            fprintf(stderr, "  %s[%zu]: got %.9g want %.9g\n", what, i, (double)got[i], (double)want[i]);
            bad++;
        }
    }
    free(want);
    return bad == 0;
}

// Decay mask for the fixture's tensors (sizes/decay arrays) built the way the layout builder does.
static sl_decay_mask fixture_mask(const cJSON *c, sl_range *storage) {
    sl_decay_mask mask = {storage, 0};
    size_t off = 0;
    const cJSON *sizes = cJSON_GetObjectItem(c, "sizes"), *decay = cJSON_GetObjectItem(c, "decay");
    for (int i = 0; i < cJSON_GetArraySize(sizes); i++) {
        size_t n = (size_t)cJSON_GetArrayItem(sizes, i)->valuedouble;
        if (cJSON_GetArrayItem(decay, i)->valuedouble != 0) storage[mask.n++] = (sl_range){off, off + n};
        off += n;
    }
    return mask;
}

static void config_from_case(sl_optim_config *cfg, const cJSON *c) {
    sl_optim_defaults(cfg);
    const char *type = cJSON_GetObjectItem(c, "type")->valuestring;
    cfg->weight_decay = cJSON_GetObjectItem(c, "weight_decay")->valuedouble;
    if (strcmp(type, "SGD") == 0) {
        cfg->type = SL_OPTIM_SGD;
        cfg->momentum = cJSON_GetObjectItem(c, "momentum")->valuedouble;
        cfg->dampening = cJSON_GetObjectItem(c, "dampening")->valuedouble;
        cfg->nesterov = cJSON_IsTrue(cJSON_GetObjectItem(c, "nesterov"));
    } else {
        cfg->type = cJSON_GetObjectItem(c, "adam_w_mode") ? SL_OPTIM_ADAM : SL_OPTIM_ADAMW;
        cfg->beta1 = cJSON_GetArrayItem(cJSON_GetObjectItem(c, "betas"), 0)->valuedouble;
        cfg->beta2 = cJSON_GetArrayItem(cJSON_GetObjectItem(c, "betas"), 1)->valuedouble;
        cfg->eps = cJSON_GetObjectItem(c, "eps")->valuedouble;
    }
}

// Runs one fixture case over the flat buffer cut into `shards` sub-ranges; returns the state.
static void run_case(const cJSON *c, int shards, float **p_out, float **s0_out, float **s1_out, size_t *n_out) {
    sl_optim_config cfg;
    config_from_case(&cfg, c);
    sl_range storage[16];
    sl_decay_mask mask = fixture_mask(c, storage);
    size_t n;
    float *p = floats(cJSON_GetObjectItem(c, "params0"), &n);
    float *s0 = calloc(n, sizeof *s0), *s1 = calloc(n, sizeof *s1);
    const cJSON *grads = cJSON_GetObjectItem(c, "grads"), *lrs = cJSON_GetObjectItem(c, "lr");
    for (int step = 0; step < cJSON_GetArraySize(grads); step++) {
        float *g = floats(cJSON_GetArrayItem(grads, step), NULL);
        double lr = cJSON_GetArrayItem(lrs, step)->valuedouble;
        for (int s = 0; s < shards; s++) {
            size_t b = n * (size_t)s / (size_t)shards, e = n * (size_t)(s + 1) / (size_t)shards;
            float *state[2] = {s0 + b, s1 + b};
            int rc = sl_optim_step(&cfg, lr, step + 1, p + b, g + b, state, &mask, b, e);
            CHECK_MSG(rc == 0, "%s", sl_error());
        }
        free(g);
    }
    *p_out = p, *s0_out = s0, *s1_out = s1, *n_out = n;
}

TEST(optimizers_match_torch) {
    cJSON *root = load_fixture();
    CHECK(root != NULL);
    if (!root) return;
    int n_cases = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "optimizers")) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        float *p, *s0, *s1;
        size_t n;
        run_case(c, 1, &p, &s0, &s1, &n);
        char what[64];
        snprintf(what, sizeof what, "%s params", name);
        CHECK_MSG(check_array(what, p, cJSON_GetObjectItem(c, "params"), n), "%s", name);
        if (cJSON_GetObjectItem(c, "exp_avg")) {
            CHECK_MSG(check_array("exp_avg", s0, cJSON_GetObjectItem(c, "exp_avg"), n), "%s", name);
            CHECK_MSG(check_array("exp_avg_sq", s1, cJSON_GetObjectItem(c, "exp_avg_sq"), n), "%s", name);
        }
        if (cJSON_GetObjectItem(c, "momentum_buffer"))
            CHECK_MSG(check_array("momentum_buffer", s0, cJSON_GetObjectItem(c, "momentum_buffer"), n), "%s", name);
        free(p), free(s0), free(s1);
        n_cases++;
    }
    CHECK(n_cases == 5);
    cJSON_Delete(root);
}

// A step over shards [b, e) must give exactly (bitwise) the full-range result.
TEST(sharded_steps_equal_full_step) {
    cJSON *root = load_fixture();
    if (!root) { CHECK(0); return; }
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "optimizers")) {
        float *p1, *a1, *b1, *p3, *a3, *b3;
        size_t n;
        run_case(c, 1, &p1, &a1, &b1, &n);
        run_case(c, 7, &p3, &a3, &b3, &n);
        CHECK(memcmp(p1, p3, n * sizeof(float)) == 0);
        CHECK(memcmp(a1, a3, n * sizeof(float)) == 0);
        CHECK(memcmp(b1, b3, n * sizeof(float)) == 0);
        free(p1), free(a1), free(b1), free(p3), free(a3), free(b3);
    }
    cJSON_Delete(root);
}

TEST(clip_matches_torch) {
    cJSON *root = load_fixture();
    if (!root) { CHECK(0); return; }
    int n_cases = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "clip")) {
        size_t n;
        float *g = floats(cJSON_GetObjectItem(c, "grads"), &n);
        float max_norm = (float)cJSON_GetObjectItem(c, "max_norm")->valuedouble;
        double norm = sl_clip_grad_norm(g, n, max_norm);
        CHECK_CLOSE(norm, cJSON_GetObjectItem(c, "norm")->valuedouble, 1e-6);
        CHECK(check_array("clipped", g, cJSON_GetObjectItem(c, "clipped"), n));
        free(g);
        n_cases++;
    }
    CHECK(n_cases == 2);
    cJSON_Delete(root);
}

TEST(clip_coef_semantics) {
    CHECK(sl_clip_coef(0.5, 1.0f) == 1.0);
    CHECK(sl_clip_coef(1.0, 1.0f) < 1.0);             // 1 / (1 + 1e-6) < 1: clips a hair
    CHECK_CLOSE(sl_clip_coef(4.0, 1.0f), 1.0 / (4.0 + 1e-6), 1e-15);
    CHECK(sl_clip_coef(1e9, 0.0f) == 1.0);             // gradient_clipping 0: disabled
    float g[3] = {3, 4, 0};
    double norm = sl_clip_grad_norm(g, 3, 10.0f);
    CHECK(norm == 5.0);
    CHECK(g[0] == 3.0f && g[1] == 4.0f);
}

TEST(grad_norm_is_deterministic_across_threads) {
    size_t n = 3000001;
    float *g = malloc(n * sizeof *g);
    sl_rng r = sl_rng_make(1, 0, 0, SL_RNG_TEST);
    for (size_t i = 0; i < n; i++) g[i] = sl_rng_normal(&r) * (i % 7 == 0 ? 100.0f : 0.01f);
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    double a = sl_ops_cpu.sumsq(g, n);
    omp_set_num_threads(4);
    double b = sl_ops_cpu.sumsq(g, n);
    omp_set_num_threads(3);
    double c = sl_ops_cpu.sumsq(g, n);
    omp_set_num_threads(saved);
    CHECK(a == b && b == c);
    double ref = 0.0;  // long-double reference
    long double acc = 0.0L;
    for (size_t i = 0; i < n; i++) acc += (long double)g[i] * g[i];
    ref = (double)acc;
    CHECK_CLOSE(a, ref, 1e-12 * ref);
    CHECK(sl_ops_cpu.sumsq(g, 0) == 0.0);
    free(g);
}

TEST(decay_mask_from_layout) {
    sl_model_config cfg;
    sl_param_layout L;
    CHECK(sl_config_preset(&cfg, "gpt2-tiny") == 0);
    CHECK(sl_layout_build(&L, &cfg) == 0);
    sl_decay_mask mask;
    CHECK(sl_decay_mask_from_layout(&mask, &L, 0) == 0);
    size_t covered = 0, want = 0;
    for (int i = 0; i < mask.n; i++) {
        CHECK(mask.ranges[i].begin < mask.ranges[i].end);
        if (i > 0) CHECK(mask.ranges[i - 1].end < mask.ranges[i].begin);  // sorted, merged
        covered += mask.ranges[i].end - mask.ranges[i].begin;
    }
    for (int i = 0; i < L.n_tensors; i++) want += L.tensors[i].weight_decay ? L.tensors[i].numel : 0;
    CHECK(covered == want && want > 0);
    // The embeddings (first tensor) do not decay; the attention weights do.
    int qkv = L.blocks[0].qkv_w;
    CHECK(mask.ranges[0].begin > 0);
    int found = 0;
    for (int i = 0; i < mask.n; i++)
        found |= mask.ranges[i].begin <= L.tensors[qkv].offset && L.tensors[qkv].offset < mask.ranges[i].end;
    CHECK(found);
    sl_decay_mask_free(&mask);
    CHECK(sl_decay_mask_from_layout(&mask, &L, 1) == 0);
    CHECK(mask.n == 1 && mask.ranges[0].begin == 0 && mask.ranges[0].end == L.total);
    sl_decay_mask_free(&mask);

    // A step with weight decay and zero gradients shrinks only masked parameters.
    CHECK(sl_decay_mask_from_layout(&mask, &L, 0) == 0);
    float *p = malloc(L.total * sizeof *p), *g = calloc(L.total, sizeof *g);
    float *m = calloc(L.total, sizeof *m), *v = calloc(L.total, sizeof *v);
    for (size_t i = 0; i < L.total; i++) p[i] = 1.0f;
    sl_optim_config oc;
    sl_optim_defaults(&oc);
    oc.weight_decay = 0.5f;
    float *state[2] = {m, v};
    CHECK(sl_optim_step(&oc, 0.1f, 1, p, g, state, &mask, 0, L.total) == 0);
    for (int i = 0; i < L.n_tensors; i++) {
        float want_p = L.tensors[i].weight_decay ? 0.95f : 1.0f;
        CHECK_MSG(p[L.tensors[i].offset] == want_p && p[L.tensors[i].offset + L.tensors[i].numel - 1] == want_p,
                  "%s", L.tensors[i].name);
    }
    free(p), free(g), free(m), free(v);
    sl_decay_mask_free(&mask);
    sl_layout_free(&L);
}

static int parse_text(sl_optim_config *cfg, const char *json) {
    cJSON *root = cJSON_Parse(json);
    if (!root) return sl_errorf("bad test JSON");
    int rc = sl_optim_parse(cfg, root, "test");
    cJSON_Delete(root);
    return rc;
}

TEST(parse_deepspeed_optimizer_block) {
    sl_optim_config c;
    CHECK(sl_optim_parse(&c, NULL, "test") == 0 && c.type == SL_OPTIM_ADAMW && c.lr == 1e-3);
    CHECK(parse_text(&c, "{\"type\":\"AdamW\",\"params\":{\"lr\":6e-4,\"betas\":[0.9,0.95],\"eps\":1e-8,"
                         "\"weight_decay\":0.1}}") == 0);
    CHECK(c.type == SL_OPTIM_ADAMW && c.lr == 6e-4 && c.beta2 == 0.95 && c.weight_decay == 0.1);
    CHECK(c.warning[0] == '\0');
    CHECK(parse_text(&c, "{\"type\":\"Adam\",\"params\":{\"lr\":1e-4}}") == 0 && c.type == SL_OPTIM_ADAMW);
    CHECK(parse_text(&c, "{\"type\":\"adam\",\"params\":{\"adam_w_mode\":false}}") == 0 && c.type == SL_OPTIM_ADAM);
    CHECK(parse_text(&c, "{\"type\":\"AdamW\",\"params\":{\"adam_w_mode\":false}}") == 0 && c.type == SL_OPTIM_ADAMW);
    CHECK(parse_text(&c, "{\"type\":\"SGD\",\"params\":{\"lr\":0.1,\"momentum\":0.9,\"nesterov\":true}}") == 0);
    CHECK(c.type == SL_OPTIM_SGD && c.momentum == 0.9 && c.nesterov == 1);
    CHECK(sl_optim_num_state_buffers(&c) == 1);
    CHECK(parse_text(&c, "{\"type\":\"AdamW\",\"params\":{\"lr\":1e-3,\"amsgrad\":true,\"foo\":1},\"bar\":2}") == 0);
    CHECK(strstr(c.warning, "amsgrad") && strstr(c.warning, "foo") && strstr(c.warning, "bar"));
    CHECK(parse_text(&c, "{\"type\":\"AdamW\",\"params\":{\"decay_all\":true}}") == 0 && c.decay_all == 1);
}

TEST(parse_errors_name_the_key) {
    sl_optim_config c;
    CHECK(parse_text(&c, "{\"type\":\"Lamb\"}") == -1 && strstr(sl_error(), "Lamb"));
    CHECK(parse_text(&c, "{\"params\":{}}") == -1 && strstr(sl_error(), "optimizer.type"));
    CHECK(parse_text(&c, "{\"type\":\"AdamW\",\"params\":{\"lr\":\"0.1\"}}") == -1 && strstr(sl_error(), "lr"));
    CHECK(parse_text(&c, "{\"type\":\"AdamW\",\"params\":{\"betas\":[0.9]}}") == -1 && strstr(sl_error(), "betas"));
    CHECK(parse_text(&c, "{\"type\":\"AdamW\",\"params\":{\"betas\":[0.9,1.5]}}") == -1 && strstr(sl_error(), "betas"));
    CHECK(parse_text(&c, "{\"type\":\"AdamW\",\"params\":{\"weight_decay\":-1}}") == -1 &&
          strstr(sl_error(), "weight_decay"));
    CHECK(parse_text(&c, "{\"type\":\"AdamW\",\"params\":{\"adam_w_mode\":1}}") == -1 &&
          strstr(sl_error(), "adam_w_mode"));
    CHECK(parse_text(&c, "{\"type\":\"AdamW\",\"params\":{\"max_grad_norm\":1}}") == -1 &&
          strstr(sl_error(), "gradient_clipping"));
    CHECK(parse_text(&c, "{\"type\":\"SGD\",\"params\":{\"nesterov\":true}}") == -1 && strstr(sl_error(), "nesterov"));
    CHECK(parse_text(&c, "{\"type\":\"SGD\",\"params\":3}") == -1 && strstr(sl_error(), "optimizer.params"));
}

TEST(step_argument_errors) {
    sl_optim_config c;
    sl_optim_defaults(&c);
    float p[4] = {0}, g[4] = {0}, m[4] = {0};
    float *state[2] = {m, NULL};
    CHECK(sl_optim_step(&c, 1e-3f, 1, p, g, state, NULL, 0, 4) == -1 && strstr(sl_error(), "NULL"));
    state[1] = m;
    CHECK(sl_optim_step(&c, 1e-3f, 0, p, g, state, NULL, 0, 4) == -1);
    CHECK(sl_optim_step(&c, 1e-3f, 1, p, g, state, NULL, 4, 2) == -1);
    c.type = SL_OPTIM_SGD;  // plain SGD needs no state
    CHECK(sl_optim_step(&c, 1e-3f, 1, p, g, NULL, NULL, 0, 4) == 0);
}

// Gradient clipping's coefficient and the bf16 weight copy inside Adam / AdamW's pass
// (sl_optim_step_on's grad_coef and storage_bf16) give the bits of scaling the gradients first, stepping
// with them, then converting the parameters (to_storage); other optimizers refuse both.
TEST(grad_coef_and_bf16_copy_in_the_pass) {
    enum { N = 10007 };  // several of the CPU loop's 4096-element blocks and a partial one
    float *p[2], *g[2], *m[2], *v[2];
    sl_bf16 *copy[2];
    for (int k = 0; k < 2; k++) {
        p[k] = malloc(N * sizeof(float)), g[k] = malloc(N * sizeof(float));
        m[k] = malloc(N * sizeof(float)), v[k] = malloc(N * sizeof(float));
        copy[k] = calloc(N, sizeof(sl_bf16));
    }
    sl_rng rng;
    for (int type = 0; type < 2; type++) {
        sl_optim_config c;
        sl_optim_defaults(&c);
        c.type = type ? SL_OPTIM_ADAM : SL_OPTIM_ADAMW;
        c.weight_decay = 0.1;
        const float coef = 0.3712f;
        rng = sl_rng_make(7, 0, 0, 0);
        for (int i = 0; i < N; i++) {
            p[0][i] = p[1][i] = sl_rng_normal(&rng);
            g[0][i] = g[1][i] = 3.0f * sl_rng_normal(&rng);
            m[0][i] = m[1][i] = 0.1f * sl_rng_normal(&rng);
            v[0][i] = v[1][i] = fabsf(0.01f * sl_rng_normal(&rng));
        }
        float *s0[2] = {m[0], v[0]}, *s1[2] = {m[1], v[1]};
        for (int step = 1; step <= 3; step++) {
            // what the engine did before: scale, step, convert
            sl_ops_cpu.scale(g[0], N, coef);
            CHECK(sl_optim_step_on(&sl_ops_cpu, &c, 1e-3, step, p[0], g[0], 1.0f, NULL, s0, NULL, 0, N) == 0);
            sl_ops_cpu.to_storage(copy[0], p[0], N);
            CHECK(sl_optim_step_on(&sl_ops_cpu, &c, 1e-3, step, p[1], g[1], coef, copy[1], s1, NULL, 0, N) == 0);
            memcpy(g[0], g[1], N * sizeof(float));  // the unscaled gradients again for the next step
        }
        CHECK_MSG(!memcmp(p[0], p[1], N * sizeof(float)) && !memcmp(m[0], m[1], N * sizeof(float)) &&
                      !memcmp(v[0], v[1], N * sizeof(float)),
                  "%s: grad_coef differs from scaling first", sl_optim_name(c.type));
        CHECK_MSG(!memcmp(copy[0], copy[1], N * sizeof(sl_bf16)), "%s: the bf16 copy differs from to_storage",
                  sl_optim_name(c.type));
    }
    sl_optim_config c;
    sl_optim_defaults(&c);
    c.type = SL_OPTIM_SGD;
    CHECK(sl_optim_step_on(&sl_ops_cpu, &c, 1e-3, 1, p[0], g[0], 0.5f, NULL, NULL, NULL, 0, N) == -1 &&
          strstr(sl_error(), "scale them first"));
    CHECK(sl_optim_step_on(&sl_ops_cpu, &c, 1e-3, 1, p[0], g[0], 1.0f, copy[0], NULL, NULL, 0, N) == -1 &&
          strstr(sl_error(), "no bf16 copy"));
    for (int k = 0; k < 2; k++) free(p[k]), free(g[k]), free(m[k]), free(v[k]), free(copy[k]);
}

// --optimizer: the type switches as a type-only block would, keeping lr, weight decay and Adam's betas.
TEST(select_switches_type_and_keeps_lr) {
    sl_optim_config c;
    sl_optim_defaults(&c);
    c.lr = 0.5, c.weight_decay = 0.25, c.beta1 = 0.8, c.beta2 = 0.9, c.eps = 1e-6, c.momentum = 0.7, c.decay_all = 1;
    CHECK(sl_optim_select(&c, "Adam", "--optimizer") == 0);
    CHECK(c.type == SL_OPTIM_ADAM && c.lr == 0.5 && c.weight_decay == 0.25 && c.beta1 == 0.8 && c.beta2 == 0.9);
    CHECK(c.eps == 1e-8 && c.momentum == 0 && c.decay_all == 0);
    CHECK(sl_optim_select(&c, "sgd", "--optimizer") == 0);
    CHECK(c.type == SL_OPTIM_SGD && c.lr == 0.5 && c.weight_decay == 0.25 && c.beta1 == 0.9 && c.beta2 == 0.999);
    CHECK(sl_optim_select(&c, "ADAMW", "--optimizer") == 0 && c.type == SL_OPTIM_ADAMW);
    c.min_8bit_size = 100;
    CHECK(sl_optim_select(&c, "AdamW8bit", "--optimizer") == 0 && c.type == SL_OPTIM_ADAMW8BIT &&
          c.min_8bit_size == 100);
    CHECK(sl_optim_select(&c, "lion", "--optimizer") == -1 &&
          strcmp(sl_error(), "--optimizer must be adamw, adam, sgd or adamw8bit (got 'lion')") == 0);
    CHECK(c.type == SL_OPTIM_ADAMW8BIT);  // a refused name changes nothing
}

TEST_MAIN()
