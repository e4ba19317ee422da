// test_engine_checkpoint.c: an engine's checkpoint save and load go through explicit host staging.
// A CPU ops table that plays a device (on_device = 1, its buffers registered at alloc) checks every
// download reads from and every upload writes into a registered buffer from host memory, and that no
// engine or model pointer has moved whenever one is called. Then:
//   * save + load restore parameters, optimizer state, master weights, the bf16 weight copy, the
//     loss scaler and the step exactly (fp32 AdamW, SGD with momentum, fp16, bf16 with and without
//     bf16 activation storage), with staging chunks far smaller than a tensor, and the next step
//     of the loaded engine equals the saved one's;
//   * ZeRO stages 1-3 (a world of one) round-trip the same way; a ZeRO-3 checkpoint loads into a
//     stage-0 engine;
//   * a failed device copy during a save is an error naming what was being copied, the checkpoint
//     and the step, and leaves the previous checkpoint as `latest` with no temporary behind; so is
//     a failed copy during a load.
#include "test.h"
#include "shardlm/checkpoint.h"
#include "shardlm/engine.h"
#include "shardlm/error.h"

#include <glob.h>
#include <stdint.h>

// ---- a "device": the CPU backend with registered buffers and checked copies --------------------

#define MAX_BUFFERS 1024
static struct { const char *p; size_t bytes; } buffers[MAX_BUFFERS];
static sl_ops device;
static int downloads, uploads, misplaced, moved;
static int fail_at_download, fail_at_upload;  // 1-based call that fails (0: none); sticky, as CUDA's record
static int failed;

static int is_device(const void *p, size_t bytes) {
    for (int i = 0; i < MAX_BUFFERS; i++)
        if (buffers[i].p && (const char *)p >= buffers[i].p &&
            (const char *)p + bytes <= buffers[i].p + buffers[i].bytes)
            return 1;
    return 0;
}

static void *device_alloc(size_t bytes, const char *what) {
    void *p = sl_ops_cpu.alloc(bytes, what);
    for (int i = 0; p && i < MAX_BUFFERS; i++)
        if (!buffers[i].p) {
            buffers[i].p = p;
            buffers[i].bytes = bytes;
            return p;
        }
    if (p) misplaced++;  // the registry is full: the test needs a larger one
    return p;
}

static void device_dealloc(void *p) {
    for (int i = 0; p && i < MAX_BUFFERS; i++)
        if (buffers[i].p == p) buffers[i].p = NULL;
    sl_ops_cpu.dealloc(p);
}

// Every pointer the engine and its model own, as they were when a checkpoint began.
#define MAX_POINTERS 64
static const sl_engine *watched;
static const void *pointers[MAX_POINTERS];

static int list_pointers(const sl_engine *e, const void **out) {
    const sl_model *m = e->model;
    int n = 0;
    const void *fixed[] = {m->params, m->grads, m->weights_bf16, e->optim_state[0], e->optim_state[1], e->master,
                           e->zero.shard_params, e->zero.shard_grads, m->param_view, m->grad_view, m->weight_view};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) out[n++] = fixed[i];
    for (int u = 0; u < m->layout.n_units && n + 3 <= MAX_POINTERS; u++) {
        out[n++] = m->param_view[u];
        out[n++] = m->grad_view[u];
        out[n++] = m->weight_view ? m->weight_view[u] : NULL;
    }
    return n;
}

static void watch(const sl_engine *e) {
    watched = e;
    list_pointers(e, pointers);
}

static void check_unmoved(void) {
    if (!watched) return;
    const void *now[MAX_POINTERS];
    int n = list_pointers(watched, now);
    if (memcmp(now, pointers, (size_t)n * sizeof now[0])) moved++;
}

static void device_download(void *host_dst, const void *src, size_t bytes) {
    misplaced += !is_device(src, bytes) || is_device(host_dst, bytes);
    check_unmoved();
    if (++downloads == fail_at_download) failed = 1;
    sl_ops_cpu.download(host_dst, src, bytes);
}

static void device_upload(void *dst, const void *host_src, size_t bytes) {
    misplaced += !is_device(dst, bytes) || is_device(host_src, bytes);
    check_unmoved();
    if (++uploads == fail_at_upload) failed = 1;
    sl_ops_cpu.upload(dst, host_src, bytes);
}

static void device_copy(void *dst, const void *src, size_t bytes) {
    misplaced += !is_device(dst, bytes) || !is_device(src, bytes);
    sl_ops_cpu.copy(dst, src, bytes);
}

static int device_synchronize(void) {
    return failed ? sl_errorf("CUDA error: an illegal memory access was encountered in cudaMemcpyAsync") : 0;
}

// The device over a CPU table; on_device 0 keeps it usable by ZeRO on a "self" group (which refuses
// a device's memory), with every check still in place.
static const sl_ops *make_device(const sl_ops *base, int on_device) {
    device = *base;
    device.name = "fake-device";
    device.on_device = on_device;
    device.alloc = device_alloc;
    device.dealloc = device_dealloc;
    device.download = device_download;
    device.upload = device_upload;
    device.copy = device_copy;
    device.synchronize = device_synchronize;
    downloads = uploads = misplaced = moved = 0;
    fail_at_download = fail_at_upload = failed = 0;
    watched = NULL;
    return &device;
}

// ---- engines ---------------------------------------------------------------------------------------

typedef struct {
    const char *model;
    int optim;          // SL_OPTIM_*
    int precision;      // SL_PRECISION_*
    int zero_stage;     // with a "self" group when > 0
} setup;

typedef struct {
    sl_model model;
    sl_engine engine;
    sl_comm *dp;
} rig;

static int in[64], tg[64];

static int rig_init(rig *r, const setup *s, const sl_ops *ops, uint64_t seed) {
    memset(r, 0, sizeof *r);
    sl_model_config cfg;
    if (sl_config_preset(&cfg, s->model) || sl_model_create(&r->model, &cfg, ops)) return -1;
    if (sl_model_init_weights(&r->model, seed)) return -1;
    for (int i = 0; i < 64; i++) {
        in[i] = (i * 37 + 11) % cfg.vocab_size;
        tg[i] = (i * 53 + 5) % cfg.vocab_size;
    }
    sl_engine_config ec = {.micro_batch = 2, .grad_accum_steps = 2, .gradient_clipping = 1.0f};
    sl_optim_defaults(&ec.optim);
    ec.optim.type = s->optim;
    ec.optim.lr = 1e-2;
    ec.optim.momentum = 0.9;
    sl_schedule_constant(&ec.schedule, ec.optim.lr);
    sl_loss_scaler_defaults(&ec.precision);
    ec.precision.precision = s->precision;
    if (s->zero_stage > 0) {
        if (sl_comm_init_world(&r->dp, "self", NULL, NULL)) return -1;
        ec.dp = r->dp;
        ec.zero_stage = s->zero_stage;
    }
    if (sl_engine_init(&r->engine, &r->model, &ec)) return -1;
    r->engine.ckpt_stage_floats = 777;  // many chunks per tensor, and a remainder
    return 0;
}

static int rig_step(rig *r, float *loss) {
    for (int k = 0; k < 2; k++)
        if (sl_engine_forward_backward(&r->engine, in + 32 * k, tg + 32 * k, 2, 16, NULL)) return -1;
    if (sl_engine_step(&r->engine)) return -1;
    if (loss) *loss = r->engine.last_loss;
    return 0;
}

static void rig_free(rig *r) {
    sl_engine_free(&r->engine);
    sl_model_free(&r->model);
    if (r->dp) sl_comm_free(r->dp);
}

// The engine's whole trainable state, as host bytes.
typedef struct {
    float *params, *state[2], *master;
    sl_bf16 *shadow;
    size_t n_params, n_state, n_master, n_shadow;
    int64_t step;
    sl_loss_scaler scaler;
} snapshot;

static float *copy_floats(const float *p, size_t n) {
    if (!p || !n) return NULL;
    float *h = malloc(n * sizeof(float));
    if (h) memcpy(h, p, n * sizeof(float));
    return h;
}

static snapshot take(const sl_engine *e) {
    const sl_model *m = e->model;
    int stage3 = e->sharded && e->zero.stage == 3;
    snapshot s = {0};
    s.n_params = stage3 ? e->shard_size : m->layout.total;
    s.params = copy_floats(stage3 ? e->zero.shard_params : m->params, s.n_params);
    s.n_state = e->state_numel;
    for (int i = 0; i < e->n_optim_state; i++) s.state[i] = copy_floats(e->optim_state[i], s.n_state);
    s.n_master = e->master ? e->shard_size : 0;
    s.master = copy_floats(e->master, s.n_master);
    s.n_shadow = m->weights_bf16 ? m->layout.total : 0;
    if (s.n_shadow && (s.shadow = malloc(s.n_shadow * sizeof(sl_bf16))))
        memcpy(s.shadow, m->weights_bf16, s.n_shadow * sizeof(sl_bf16));
    s.step = e->step;
    s.scaler = e->scaler;
    return s;
}

static void release(snapshot *s) {
    free(s->params);
    free(s->state[0]);
    free(s->state[1]);
    free(s->master);
    free(s->shadow);
}

static int same_floats(const float *a, const float *b, size_t n) {
    return n == 0 || (a && b && !memcmp(a, b, n * sizeof(float)));
}

static void check_same(const snapshot *a, const snapshot *b, const char *what) {
    CHECK_MSG(a->n_params == b->n_params && same_floats(a->params, b->params, a->n_params), "%s: parameters", what);
    for (int i = 0; i < 2; i++)
        CHECK_MSG(same_floats(a->state[i], b->state[i], a->state[i] ? a->n_state : 0), "%s: optimizer state %d", what,
                  i);
    CHECK_MSG(a->n_master == b->n_master && same_floats(a->master, b->master, a->n_master), "%s: master weights", what);
    int shadow_same = !a->n_shadow || !memcmp(a->shadow, b->shadow, a->n_shadow * sizeof(sl_bf16));
    CHECK_MSG(a->n_shadow == b->n_shadow && shadow_same, "%s: bf16 weight copy", what);
    CHECK_MSG(a->step == b->step, "%s: step %lld, expected %lld", what, (long long)b->step, (long long)a->step);
    const sl_loss_scaler *x = &a->scaler, *y = &b->scaler;
    CHECK_MSG(x->scale == y->scale && x->iter == y->iter && x->last_overflow_iter == y->last_overflow_iter &&
                  x->cur_hysteresis == y->cur_hysteresis && x->skipped_steps == y->skipped_steps &&
                  x->scale_decreases == y->scale_decreases && x->scale_increases == y->scale_increases,
              "%s: loss scaler", what);
}

static char root[64];

static void make_root(void) {
    snprintf(root, sizeof root, "/tmp/sl_engine_ckpt_XXXXXX");
    CHECK(mkdtemp(root) != NULL);
}

static void remove_root(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    CHECK(system(cmd) == 0);
}

// Saves a trained engine, loads it into a differently initialised one that has taken a step of its
// own, and checks pointers, state and the next step.
static void round_trip(const setup *s, const sl_ops *base, int on_device, const char *what) {
    const sl_ops *ops = make_device(base, on_device);
    rig a, b;
    CHECK_MSG(rig_init(&a, s, ops, 3) == 0 && rig_init(&b, s, ops, 9) == 0, "%s: %s", what, sl_error());
    CHECK_MSG(rig_step(&a, NULL) == 0 && rig_step(&a, NULL) == 0 && rig_step(&b, NULL) == 0, "%s: %s", what,
              sl_error());
    make_root();

    snapshot before = take(&a.engine);
    watch(&a.engine);
    CHECK_MSG(sl_engine_save(&a.engine, root, "step_00000002", "{\"k\": 1}") == 0, "%s: %s", what, sl_error());
    CHECK_MSG(downloads > 2, "%s: the save downloaded %d times", what, downloads);
    snapshot saved = take(&a.engine);
    check_same(&before, &saved, what);  // saving changes nothing

    watch(&b.engine);
    char *client = NULL;
    CHECK_MSG(sl_engine_load(&b.engine, root, &client) == 0, "%s: %s", what, sl_error());
    CHECK_MSG(uploads > 2, "%s: the load uploaded %d times", what, uploads);
    CHECK_MSG(client && strstr(client, "\"k\""), "%s: client state %s", what, client ? client : "(null)");
    free(client);
    watched = NULL;
    CHECK_MSG(moved == 0, "%s: an engine or model pointer moved during %d copies", what, moved);
    CHECK_MSG(misplaced == 0, "%s: %d copies between the wrong kinds of memory", what, misplaced);
    snapshot loaded = take(&b.engine);
    check_same(&before, &loaded, what);

    float la = 0, lb = 1;
    CHECK_MSG(rig_step(&a, &la) == 0 && rig_step(&b, &lb) == 0, "%s: %s", what, sl_error());
    CHECK_MSG(memcmp(&la, &lb, sizeof la) == 0, "%s: next loss %.9g after load, %.9g before", what, (double)lb,
              (double)la);
    snapshot na = take(&a.engine), nb = take(&b.engine);
    check_same(&na, &nb, what);
    release(&before), release(&saved), release(&loaded), release(&na), release(&nb);
    remove_root();
    rig_free(&a);
    rig_free(&b);
}

TEST(adamw_round_trip_through_host_staging) {
    round_trip(&(setup){"gpt2-tiny", SL_OPTIM_ADAMW, SL_PRECISION_FP32, 0}, &sl_ops_cpu, 1, "gpt2 fp32 adamw");
}

TEST(sgd_round_trip_through_host_staging) {
    round_trip(&(setup){"llama-tiny", SL_OPTIM_SGD, SL_PRECISION_FP32, 0}, &sl_ops_cpu, 1, "llama fp32 sgd");
}

TEST(fp16_master_and_scaler_round_trip) {
    round_trip(&(setup){"llama-tiny", SL_OPTIM_ADAMW, SL_PRECISION_FP16, 0}, &sl_ops_cpu, 1, "llama fp16");
}

TEST(bf16_round_trip_refreshes_the_weight_copy) {
    round_trip(&(setup){"gpt2-tiny", SL_OPTIM_ADAMW, SL_PRECISION_BF16, 0}, &sl_ops_cpu, 1, "gpt2 bf16");
    // bf16 activation storage: the model's fp32 parameters are the master, its bf16 copy is refreshed
    round_trip(&(setup){"gpt2-tiny", SL_OPTIM_ADAMW, SL_PRECISION_BF16, 0}, &sl_ops_cpu_bf16, 1, "gpt2 bf16 storage");
}

TEST(zero_stages_round_trip_through_host_staging) {
    for (int stage = 1; stage <= 3; stage++) {
        char what[64];
        snprintf(what, sizeof what, "llama zero-%d fp32", stage);
        round_trip(&(setup){"llama-tiny", SL_OPTIM_ADAMW, SL_PRECISION_FP32, stage}, &sl_ops_cpu, 0, what);
        snprintf(what, sizeof what, "gpt2 zero-%d fp16", stage);
        round_trip(&(setup){"gpt2-tiny", SL_OPTIM_ADAMW, SL_PRECISION_FP16, stage}, &sl_ops_cpu, 0, what);
    }
}

TEST(a_zero3_checkpoint_loads_into_a_plain_engine) {
    const sl_ops *ops = make_device(&sl_ops_cpu, 0);
    rig a, b;
    CHECK(rig_init(&a, &(setup){"llama-tiny", SL_OPTIM_ADAMW, SL_PRECISION_FP32, 3}, ops, 3) == 0);
    CHECK(rig_init(&b, &(setup){"llama-tiny", SL_OPTIM_ADAMW, SL_PRECISION_FP32, 0}, ops, 9) == 0);
    CHECK(rig_step(&a, NULL) == 0 && rig_step(&a, NULL) == 0);
    make_root();
    CHECK_MSG(sl_engine_save(&a.engine, root, "step_00000002", NULL) == 0, "%s", sl_error());
    CHECK_MSG(sl_engine_load(&b.engine, root, NULL) == 0, "%s", sl_error());
    snapshot sa = take(&a.engine), sb = take(&b.engine);  // a whole slice of one rank: everything
    check_same(&sa, &sb, "stage 3 -> stage 0");
    release(&sa), release(&sb);
    remove_root();
    rig_free(&a);
    rig_free(&b);
}

// Entries of root matching a glob(3) pattern.
static size_t matching(const char *pattern) {
    char p[160];
    snprintf(p, sizeof p, "%s/%s", root, pattern);
    glob_t g;
    size_t n = glob(p, 0, NULL, &g) == 0 ? g.gl_pathc : 0;
    globfree(&g);
    return n;
}

// A call that fails at its download or upload number `at` (the first copy of a save is the weights'):
// -1, with a message holding each of the needles (NULL-terminated) and the backend's error.
static void check_failure(sl_engine *e, int is_save, int at, const char *const *needles) {
    downloads = uploads = 0;
    *(is_save ? &fail_at_download : &fail_at_upload) = at;
    int rc = is_save ? sl_engine_save(e, root, "step_00000002", NULL) : sl_engine_load(e, root, NULL);
    CHECK(rc == -1);
    CHECK_MSG(strstr(sl_error(), "illegal memory access"), "%s", sl_error());
    for (int i = 0; needles[i]; i++)
        CHECK_MSG(strstr(sl_error(), needles[i]), "no \"%s\" in: %s", needles[i], sl_error());
    failed = fail_at_download = fail_at_upload = 0;
}

TEST(a_failed_copy_is_named_and_keeps_the_previous_checkpoint) {
    const sl_ops *ops = make_device(&sl_ops_cpu, 1);
    rig a, b;
    CHECK(rig_init(&a, &(setup){"gpt2-tiny", SL_OPTIM_ADAMW, SL_PRECISION_FP32, 0}, ops, 3) == 0);
    CHECK(rig_init(&b, &(setup){"gpt2-tiny", SL_OPTIM_ADAMW, SL_PRECISION_FP32, 0}, ops, 9) == 0);
    CHECK(rig_step(&a, NULL) == 0);
    make_root();
    CHECK_MSG(sl_engine_save(&a.engine, root, "step_00000001", NULL) == 0, "%s", sl_error());
    CHECK(rig_step(&a, NULL) == 0);

    check_failure(&a.engine, 1, 1, (const char *[]){"step_00000002", "step 2", "weights", NULL});
    const char *state[] = {"step_00000002", "step 2", "optimizer state: copying \"exp_avg", NULL};
    check_failure(&a.engine, 1, 5, state);
    char dir[4096];
    CHECK(sl_ckpt_resolve(root, dir, sizeof dir) == 0 && strstr(dir, "/step_00000001"));
    CHECK(matching("step_00000002") == 0 && matching(".tmp-*") == 0);

    check_failure(&b.engine, 0, 1, (const char *[]){"loading checkpoint", root, "step 1", "the weights", NULL});
    const char *loading[] = {"loading checkpoint", root, "step 1", "optimizer state: copying \"exp_avg", NULL};
    check_failure(&b.engine, 0, 2, loading);
    CHECK_MSG(sl_engine_load(&b.engine, root, NULL) == 0, "%s", sl_error());
    remove_root();
    rig_free(&a);
    rig_free(&b);
}

TEST_MAIN()
