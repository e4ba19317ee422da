// test_adam8.c: 8-bit AdamW against bitsandbytes 0.50's AdamW8bit on the CPU (tests/fixtures/optim/
// adam8.*, made by tests/reference/make_adam8_fixtures.py): the dynamic maps bit for bit, the state
// after step 1 byte for byte, the parameters over 20 steps; ZeRO shards that cut blocks give a
// single process's bits; the plan's state bytes; the config block.
#include "test.h"

#include "shardlm/engine.h"
#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/optim_8bit.h"
#include "shardlm/safetensors.h"

#include <cjson/cJSON.h>

#define FIXTURE "tests/fixtures/optim/adam8"
#define MAX_TENSORS 8

typedef struct {
    sl_st_file st;
    int n, steps, grad_sets;
    double lr[64];
    sl_tensor_info tensors[MAX_TENSORS];
    sl_param_layout L;
    sl_optim_config cfg;
} fixture;

static int fixture_open(fixture *fx) {
    memset(fx, 0, sizeof *fx);
    char *text = sl_read_text_file(FIXTURE ".json", NULL);
    cJSON *m = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!m || sl_st_open(&fx->st, FIXTURE ".safetensors")) {
        fprintf(stderr, "  cannot read the fixture: %s\n", sl_error());
        cJSON_Delete(m);
        return -1;
    }
    const cJSON *sizes = cJSON_GetObjectItem(m, "sizes"), *decay = cJSON_GetObjectItem(m, "decay");
    fx->n = cJSON_GetArraySize(sizes);
    size_t off = 0;
    for (int i = 0; i < fx->n && i < MAX_TENSORS; i++) {
        sl_tensor_info *t = &fx->tensors[i];
        snprintf(t->name, sizeof t->name, "t%d", i);
        t->offset = off;
        t->numel = (size_t)cJSON_GetArrayItem(sizes, i)->valuedouble;
        t->ndim = 1;
        t->weight_decay = cJSON_GetArrayItem(decay, i)->valuedouble != 0;
        off += t->numel;
    }
    fx->L.tensors = fx->tensors;
    fx->L.n_tensors = fx->n;
    fx->L.total = off;
    fx->steps = (int)cJSON_GetObjectItem(m, "steps")->valuedouble;
    fx->grad_sets = (int)cJSON_GetObjectItem(m, "grad_sets")->valuedouble;
    for (int s = 0; s < fx->steps && s < 64; s++) fx->lr[s] = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "lr"), s)->valuedouble;
    sl_optim_defaults(&fx->cfg);
    fx->cfg.type = SL_OPTIM_ADAMW8BIT;
    fx->cfg.beta1 = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "betas"), 0)->valuedouble;
    fx->cfg.beta2 = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "betas"), 1)->valuedouble;
    fx->cfg.eps = cJSON_GetObjectItem(m, "eps")->valuedouble;
    fx->cfg.weight_decay = cJSON_GetObjectItem(m, "weight_decay")->valuedouble;
    fx->cfg.min_8bit_size = (long long)cJSON_GetObjectItem(m, "min_8bit_size")->valuedouble;
    cJSON_Delete(m);
    return 0;
}

// A fixture tensor read whole (F32 or U8 as stored); *n its element count. malloc'd.
static void *fixture_tensor(fixture *fx, const char *name, sl_st_dtype dtype, size_t *n) {
    int k = sl_st_find(&fx->st, name);
    if (k < 0) { fprintf(stderr, "  fixture has no tensor %s\n", name); return NULL; }
    size_t numel = fx->st.tensors[k].numel;
    void *out = malloc(numel * sl_st_dtype_size(dtype) + 1);
    if (sl_st_read_raw_range(&fx->st, k, dtype, 0, numel, out)) { fprintf(stderr, "  %s\n", sl_error()); free(out); return NULL; }
    if (n) *n = numel;
    return out;
}

// One rank's share of a run: its plan over [begin, end), state and parameters.
typedef struct {
    sl_adam8_plan plan;
    sl_adam8_state st;
} rank_state;

// `world` ranks with ZeRO's equal slices (ceil(total / world) each) take fx->steps steps on params
// (the whole flat buffer, each rank updating its slice), the cut blocks' absmax exchanged as the
// all-gather would. after_step(s) is called after each step when not NULL.
static int run_ranks(fixture *fx, int world, float *params, rank_state *ranks, int stop_after) {
    size_t total = fx->L.total, shard = (total + (size_t)world - 1) / (size_t)world;
    float *grads[8];
    for (int k = 0; k < fx->grad_sets && k < 8; k++) {
        char name[32];
        snprintf(name, sizeof name, "grads%d", k);
        if (!(grads[k] = fixture_tensor(fx, name, SL_ST_F32, NULL))) return -1;
    }
    for (int r = 0; r < world; r++)
        if (sl_adam8_plan_build(&ranks[r].plan, fx->L.tensors, fx->L.n_tensors, fx->L.total, &fx->cfg,
                                (size_t)r * shard, (size_t)(r + 1) * shard) ||
            sl_adam8_state_alloc(&ranks[r].st, &ranks[r].plan))
            return -1;
    double *records = calloc((size_t)world * 6, sizeof(double));
    for (int s = 0; s < stop_after; s++) {
        sl_adam8_args a;
        sl_adam8_args_make(&fx->cfg, fx->lr[s], s + 1, &a);
        const float *g = grads[s % fx->grad_sets];
        for (int r = 0; r < world; r++) {
            sl_adam8_edges mine = {{0, 0}, {0, 0}};
            size_t b = ranks[r].plan.begin;
            sl_ops_cpu.adam8_step(&a, params + b, g + b, &ranks[r].st, ranks[r].plan.segs, ranks[r].plan.n_segs, &mine, 1);
            sl_adam8_edges_record(&ranks[r].plan, &mine, records + 6 * r);
        }
        for (int r = 0; r < world; r++) {
            sl_adam8_edges edges;
            sl_adam8_edges_combine(&ranks[r].plan, records, world, &edges);
            size_t b = ranks[r].plan.begin;
            sl_ops_cpu.adam8_step(&a, params + b, g + b, &ranks[r].st, ranks[r].plan.segs, ranks[r].plan.n_segs, &edges,
                                  0);
        }
    }
    free(records);
    for (int k = 0; k < fx->grad_sets && k < 8; k++) free(grads[k]);
    return 0;
}

static void free_ranks(rank_state *ranks, int world) {
    for (int r = 0; r < world; r++) {
        sl_adam8_plan_free(&ranks[r].plan);
        sl_adam8_state_free(&ranks[r].st);
    }
}

// Largest |got - want| / max(|want|, floor) over n values, and how many are not bit-identical.
static double max_rel(const float *got, const float *want, size_t n, double floor_, size_t *differ) {
    double worst = 0.0;
    *differ = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]) / fmax(fabs(want[i]), floor_);
        if (d > worst) worst = d;
        *differ += memcmp(&got[i], &want[i], sizeof(float)) != 0;
    }
    return worst;
}

TEST(dynamic_maps_equal_bitsandbytes) {
    fixture fx;
    if (fixture_open(&fx)) { CHECK(0); return; }
    float *want_s = fixture_tensor(&fx, "map_signed", SL_ST_F32, NULL);
    float *want_u = fixture_tensor(&fx, "map_unsigned", SL_ST_F32, NULL);
    float got_s[256], got_u[256];
    sl_dynamic_map(1, got_s);
    sl_dynamic_map(0, got_u);
    CHECK(want_s && want_u);
    if (want_s && want_u) {
        CHECK(memcmp(got_s, want_s, sizeof got_s) == 0);
        CHECK(memcmp(got_u, want_u, sizeof got_u) == 0);
    }
    free(want_s);
    free(want_u);
    sl_st_close(&fx.st);
}

// The plan's sizes and the printed formula: 2 bytes per 8-bit element, 8 per block, 8 per 32-bit element.
TEST(plan_counts_bitsandbytes_state) {
    fixture fx;
    if (fixture_open(&fx)) { CHECK(0); return; }
    sl_adam8_plan p;
    CHECK(sl_adam8_plan_build(&p, fx.L.tensors, fx.L.n_tensors, fx.L.total, &fx.cfg, 0, fx.L.total) == 0);
    size_t n8 = 0, n32 = 0, blocks = 0;
    for (int i = 0; i < fx.n; i++) {
        if ((long long)fx.tensors[i].numel >= fx.cfg.min_8bit_size) {
            n8 += fx.tensors[i].numel;
            blocks += (fx.tensors[i].numel + 255) / 256;   // bitsandbytes: n // 256 + bool(n % 256)
        } else {
            n32 += fx.tensors[i].numel;
        }
    }
    CHECK(p.n8 == n8 && p.n32 == n32 && p.n_blocks == blocks);
    CHECK(sl_adam8_state_bytes(&p) == 2 * n8 + 8 * blocks + 8 * n32);
    CHECK(!p.has_head && !p.has_tail);
    size_t state1_n = 0;
    free(fixture_tensor(&fx, "state1_1", SL_ST_U8, &state1_n));
    size_t absmax_n = 0;
    free(fixture_tensor(&fx, "absmax1_1", SL_ST_F32, &absmax_n));
    CHECK(state1_n == n8 && absmax_n == blocks);
    sl_adam8_plan_free(&p);
    sl_st_close(&fx.st);
}

// After step 1: every code byte and absmax equal to bitsandbytes'; parameters and 32-bit state too.
TEST(step1_state_equals_bitsandbytes) {
    fixture fx;
    if (fixture_open(&fx)) { CHECK(0); return; }
    size_t n;
    float *params = fixture_tensor(&fx, "params0", SL_ST_F32, &n);
    rank_state r;
    CHECK(params && run_ranks(&fx, 1, params, &r, 1) == 0);
    unsigned char *q1 = fixture_tensor(&fx, "state1_1", SL_ST_U8, NULL), *q2 = fixture_tensor(&fx, "state2_1", SL_ST_U8, NULL);
    float *a1 = fixture_tensor(&fx, "absmax1_1", SL_ST_F32, NULL), *a2 = fixture_tensor(&fx, "absmax2_1", SL_ST_F32, NULL);
    float *m = fixture_tensor(&fx, "exp_avg_1", SL_ST_F32, NULL), *v = fixture_tensor(&fx, "exp_avg_sq_1", SL_ST_F32, NULL);
    float *p1 = fixture_tensor(&fx, "params1", SL_ST_F32, NULL);
    size_t bad1 = 0, bad2 = 0;
    for (size_t i = 0; i < r.plan.n8; i++) bad1 += r.st.q1[i] != q1[i], bad2 += r.st.q2[i] != q2[i];
    CHECK_MSG(bad1 == 0 && bad2 == 0, "%zu exp_avg and %zu exp_avg_sq codes of %zu differ", bad1, bad2, r.plan.n8);
    CHECK(memcmp(r.st.absmax1, a1, r.plan.n_blocks * sizeof(float)) == 0);
    CHECK(memcmp(r.st.absmax2, a2, r.plan.n_blocks * sizeof(float)) == 0);
    CHECK(memcmp(r.st.m32, m, r.plan.n32 * sizeof(float)) == 0);
    CHECK(memcmp(r.st.v32, v, r.plan.n32 * sizeof(float)) == 0);
    // The parameters within 2 float ulps, not bit for bit: torch's CPU sqrt of a large float tensor is
    // not always correctly rounded (here 752 of tensor 0's 4500 square roots are 1 ulp off sqrtf's), and
    // bitsandbytes feeds it into the parameter update (the codes above match all the same).
    size_t differ;
    double rel = max_rel(params, p1, n, 1e-3, &differ);
    printf("  step 1: %zu of %zu parameters differ from bitsandbytes' bits, max rel %.3g\n", differ, n, rel);
    CHECK(rel <= 2.4e-7);
    free(q1), free(q2), free(a1), free(a2), free(m), free(v), free(p1), free(params);
    free_ranks(&r, 1);
    sl_st_close(&fx.st);
}

// 20 steps: parameters within 1e-4 of max(|p|, 1) and at most 0.1% of the exp_avg codes different
// (measured here: max 1.2e-7, no code different). Why not bit for bit: torch's sqrt (above) differs
// from a correctly rounded one by an ulp now and then; the parameters carry that ulp, and should it
// ever tip a value across a bin of the 65536-bin table a code flips, moving exp_avg by one step of
// the dynamic map (at most ~1.4% of the block's absmax) and a parameter by at most lr * 1.4% per
// step (< 3e-5 here): 1e-4 allows a few flips and is still 50x below the smallest update's size.
TEST(twenty_steps_track_bitsandbytes) {
    fixture fx;
    if (fixture_open(&fx)) { CHECK(0); return; }
    size_t n;
    float *params = fixture_tensor(&fx, "params0", SL_ST_F32, &n);
    rank_state r;
    CHECK(params && run_ranks(&fx, 1, params, &r, fx.steps) == 0);
    char name[32];
    snprintf(name, sizeof name, "params%d", fx.steps);
    float *want = fixture_tensor(&fx, name, SL_ST_F32, NULL);
    size_t differ;
    double rel = max_rel(params, want, n, 1.0, &differ);
    printf("  20 steps: %zu of %zu parameters differ from bitsandbytes' bits, max |diff|/max(|p|,1) = %.3g\n", differ,
           n, rel);
    CHECK(rel <= 1e-4);
    snprintf(name, sizeof name, "state1_%d", fx.steps);
    unsigned char *q1 = fixture_tensor(&fx, name, SL_ST_U8, NULL);
    snprintf(name, sizeof name, "state2_%d", fx.steps);
    unsigned char *q2 = fixture_tensor(&fx, name, SL_ST_U8, NULL);
    size_t bad1 = 0, bad2 = 0;
    for (size_t i = 0; q1 && q2 && i < r.plan.n8; i++) bad1 += r.st.q1[i] != q1[i], bad2 += r.st.q2[i] != q2[i];
    printf("  20 steps: %zu exp_avg and %zu exp_avg_sq codes of %zu differ\n", bad1, bad2, r.plan.n8);
    CHECK(q1 && q2 && bad1 <= r.plan.n8 / 1000 && bad2 <= r.plan.n8 / 1000);
    free(q1);
    free(q2);
    free(want);
    free(params);
    free_ranks(&r, 1);
    sl_st_close(&fx.st);
}

typedef struct { const rank_state *whole, *part; size_t bad; } compare_ctx;

static int compare_run(void *ctx, sl_adam8_part part, size_t src, size_t dst, size_t count) {
    compare_ctx *c = ctx;
    const sl_adam8_state *w = &c->whole->st, *p = &c->part->st;
    if (part == SL_ADAM8_CODES)
        c->bad += memcmp(w->q1 + src, p->q1 + dst, count) != 0 || memcmp(w->q2 + src, p->q2 + dst, count) != 0;
    else if (part == SL_ADAM8_ABSMAX)
        c->bad += memcmp(w->absmax1 + src, p->absmax1 + dst, count * 4) != 0 ||
                  memcmp(w->absmax2 + src, p->absmax2 + dst, count * 4) != 0;
    else
        c->bad += memcmp(w->m32 + src, p->m32 + dst, count * 4) != 0 || memcmp(w->v32 + src, p->v32 + dst, count * 4) != 0;
    return 0;
}

// ZeRO slices at 3, 7 and 64 ranks (64: slices of 229 elements, shorter than a block, so a block spans
// three ranks) give a single process's parameters and state bit for bit, compared through the
// checkpoint's element/block matching (sl_adam8_overlap).
TEST(zero_shards_equal_one_process) {
    fixture fx;
    if (fixture_open(&fx)) { CHECK(0); return; }
    size_t n;
    float *one = fixture_tensor(&fx, "params0", SL_ST_F32, &n);
    rank_state whole;
    CHECK(one && run_ranks(&fx, 1, one, &whole, fx.steps) == 0);
    int worlds[] = {3, 7, 64};
    for (int w = 0; w < 3; w++) {
        int world = worlds[w];
        float *params = fixture_tensor(&fx, "params0", SL_ST_F32, NULL);
        rank_state *ranks = calloc((size_t)world, sizeof *ranks);
        CHECK(params && run_ranks(&fx, world, params, ranks, fx.steps) == 0);
        int cut = 0;
        for (int r = 0; r < world; r++) cut += ranks[r].plan.has_head + ranks[r].plan.has_tail;
        CHECK_MSG(cut > 0, "world %d: no block was cut, the test would not test the exchange", world);
        CHECK_MSG(memcmp(params, one, n * sizeof(float)) == 0, "world %d: parameters differ from one process", world);
        compare_ctx c = {&whole, NULL, 0};
        for (int r = 0; r < world; r++) {
            c.part = &ranks[r];
            CHECK(sl_adam8_overlap(&ranks[r].plan, &whole.plan, compare_run, &c) == 0);
        }
        CHECK_MSG(c.bad == 0, "world %d: %zu state runs differ from one process", world, c.bad);
        free_ranks(ranks, world);
        free(ranks);
        free(params);
    }
    free_ranks(&whole, 1);
    free(one);
    sl_st_close(&fx.st);
}

TEST(config_block) {
    sl_optim_config c;
    cJSON *b = cJSON_Parse("{\"type\": \"AdamW8bit\", \"params\": {\"lr\": 2e-4, \"betas\": [0.9, 0.95], "
                           "\"weight_decay\": 0.1, \"min_8bit_size\": 0}}");
    CHECK(sl_optim_parse(&c, b, "cfg.json") == 0);
    CHECK(c.type == SL_OPTIM_ADAMW8BIT && c.min_8bit_size == 0 && c.beta2 == 0.95 && c.weight_decay == 0.1);
    CHECK(strcmp(sl_optim_name(c.type), "AdamW8bit") == 0);
    CHECK(sl_optim_num_state_buffers(&c) == 0);
    cJSON_Delete(b);
    b = cJSON_Parse("{\"type\": \"adamw8bit\"}");
    CHECK(sl_optim_parse(&c, b, "cfg.json") == 0 && c.min_8bit_size == 4096 && c.weight_decay == 0.0);
    cJSON_Delete(b);
    const char *bad[] = {"{\"type\": \"AdamW8bit\", \"params\": {\"min_8bit_size\": -1}}",
                         "{\"type\": \"AdamW8bit\", \"params\": {\"min_8bit_size\": 1.5}}",
                         "{\"type\": \"AdamW8bit\", \"params\": {\"min_8bit_size\": \"4096\"}}",
                         "{\"type\": \"Adam8bit\"}"};
    for (int i = 0; i < 4; i++) {
        b = cJSON_Parse(bad[i]);
        CHECK_MSG(sl_optim_parse(&c, b, "cfg.json") != 0, "accepted %s", bad[i]);
        CHECK(strstr(sl_error(), "cfg.json") != NULL);
        cJSON_Delete(b);
    }
    // the float-buffer step refuses the 8-bit optimizer instead of running plain AdamW
    sl_optim_defaults(&c);
    c.type = SL_OPTIM_ADAMW8BIT;
    float p = 1, g = 1;
    CHECK(sl_optim_step(&c, 1e-3, 1, &p, &g, NULL, NULL, 0, 1) != 0);
}

// A backend without the 8-bit kernel (as cuda today) is refused at engine init, by name; with it the
// engine steps and reports the 8-bit state's bytes as its optimizer memory.
TEST(engine_refuses_a_backend_without_the_kernel) {
    sl_model_config cfg;
    sl_model m;
    sl_ops ops = sl_ops_cpu;
    ops.name = "kernel-less";
    ops.adam8_step = NULL;
    CHECK(sl_config_preset(&cfg, "gpt2-tiny") == 0 && sl_model_create(&m, &cfg, &ops) == 0);
    sl_model_init_weights(&m, 3);
    sl_engine_config ec = {.micro_batch = 2, .grad_accum_steps = 1, .gradient_clipping = 1.0f};
    sl_optim_defaults(&ec.optim);
    ec.optim.type = SL_OPTIM_ADAMW8BIT;
    sl_schedule_constant(&ec.schedule, 1e-3);
    sl_loss_scaler_defaults(&ec.precision);
    sl_engine e;
    CHECK(sl_engine_init(&e, &m, &ec) == -1);
    CHECK_MSG(strstr(sl_error(), "AdamW8bit") && strstr(sl_error(), "kernel-less") && strstr(sl_error(), "--device cpu"),
              "%s", sl_error());
    sl_model_free(&m);

    CHECK(sl_model_create(&m, &cfg, &sl_ops_cpu) == 0);
    sl_model_init_weights(&m, 3);
    CHECK(sl_engine_init(&e, &m, &ec) == 0);
    int in[32], tg[32];
    for (int i = 0; i < 32; i++) in[i] = tg[i] = (i * 7 + 1) % cfg.vocab_size;
    float before = m.params[m.layout.tensors[0].offset];
    CHECK(sl_engine_forward_backward(&e, in, tg, 2, 16, NULL) == 0 && sl_engine_step(&e) == 0);
    CHECK(m.params[m.layout.tensors[0].offset] != before);
    sl_engine_memory mem = sl_engine_memory_use(&e);
    CHECK(mem.optim == sl_adam8_state_bytes(&e.adam8_plan) && mem.optim < 8 * m.layout.total);
    sl_engine_free(&e);
    sl_model_free(&m);
}

TEST_MAIN()
