// engine.c: the single-process training step and its checkpoints (see engine.h).
// Invariants: grads hold the sum over the micro-batches of this step, each scaled by
// 1/grad_accum_steps; grads are zero whenever micro_step == 0; `step` counts applied steps.
#include "shardlm/engine.h"
#include "shardlm/checkpoint.h"
#include "shardlm/error.h"
#include "shardlm/fault.h"
#include "shardlm/fileio.h"
#include "shardlm/hf_weights.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *STATE_NAMES[2][2] = {{"exp_avg", "exp_avg_sq"}, {"momentum_buffer", ""}};

static const char **state_names(const sl_engine *e) {
    return STATE_NAMES[e->cfg.optim.type == SL_OPTIM_SGD ? 1 : 0];
}

// FNV-1a over the parameter bytes: equal on every rank iff the parameters are bit-identical.
static long long params_hash(const float *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    unsigned long long h = 1469598103934665603ULL;
    for (size_t i = 0; i < n * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ULL;
    return (long long)(h >> 1);
}

// Rank 0's parameters to every rank, then a check that all ranks hold the same bits.
static int sync_parameters(sl_engine *e) {
    sl_model *m = e->model;
    if (sl_comm_broadcast(e->cfg.dp, m->params, m->layout.total, SL_DTYPE_F32, 0)) return -1;
    int world = sl_comm_size(e->cfg.dp);
    long long mine = params_hash(m->params, m->layout.total);
    long long *all = sl_calloc((size_t)world, sizeof(long long), "parameter hashes");
    if (!all) return -1;
    int rc = sl_comm_allgather(e->cfg.dp, &mine, all, 1, SL_DTYPE_I64);
    for (int r = 0; rc == 0 && r < world; r++)
        if (all[r] != all[0]) rc = sl_errorf("data-parallel rank %d holds different parameters from rank 0 after the "
                                             "broadcast", r);
    free(all);
    return rc;
}

int sl_engine_init(sl_engine *e, sl_model *model, const sl_engine_config *cfg) {
    memset(e, 0, sizeof *e);
    e->model = model;
    e->cfg = *cfg;
    if (cfg->micro_batch <= 0 || cfg->grad_accum_steps <= 0)
        return sl_errorf("engine: micro batch (%d) and gradient accumulation steps (%d) must be positive",
                         cfg->micro_batch, cfg->grad_accum_steps);
    if (sl_decay_mask_from_layout(&e->decay_mask, &model->layout, cfg->optim.decay_all)) return -1;
    if (cfg->zero_stage < 0 || cfg->zero_stage > 1)
        return sl_errorf("engine: ZeRO stage %d is not available (stages 0 and 1 are)", cfg->zero_stage);
    e->distributed = cfg->dp && sl_comm_size(cfg->dp) > 1;
    e->sharded = e->distributed && cfg->zero_stage >= 1;
    size_t total = model->layout.total;
    e->padded_total = total;
    e->shard_begin = 0;
    e->shard_size = total;
    if (e->sharded) {
        size_t world = (size_t)sl_comm_size(cfg->dp);
        e->shard_size = (total + world - 1) / world;
        e->padded_total = e->shard_size * world;
        e->shard_begin = e->shard_size * (size_t)sl_comm_rank(cfg->dp);
        if (sl_model_reserve(model, e->padded_total)) { sl_engine_free(e); return -1; }
    }
    e->state_numel = e->shard_size;
    e->n_optim_state = sl_optim_num_state_buffers(&cfg->optim);
    for (int i = 0; i < e->n_optim_state; i++) {
        e->optim_state[i] = sl_calloc(e->state_numel, sizeof(float), "optimizer state");
        if (!e->optim_state[i]) { sl_engine_free(e); return -1; }
    }
    sl_model_zero_grad(model);
    if (e->distributed) {
        size_t bucket = cfg->reduce_bucket_size ? cfg->reduce_bucket_size : 500000000;
        if (sync_parameters(e) ||
            sl_ddp_init(&e->ddp, cfg->dp, model->grads, model->layout.total, bucket, cfg->first_bucket_size,
                        cfg->overlap_comm)) {
            sl_engine_free(e);
            return -1;
        }
    }
    return 0;
}

void sl_engine_free(sl_engine *e) {
    for (int i = 0; i < 2; i++) free(e->optim_state[i]);
    sl_decay_mask_free(&e->decay_mask);
    if (e->distributed) sl_ddp_free(&e->ddp);
    memset(e, 0, sizeof *e);
}

int sl_engine_forward_backward(sl_engine *e, const int *inputs, const int *targets, int B, int T, float *loss) {
    float l;
    int last_micro = e->micro_step + 1 == e->cfg.grad_accum_steps;
    if (sl_model_forward(e->model, inputs, targets, B, T, &l)) return -1;
    if (e->distributed && last_micro) {
        e->model->grad_ready = sl_ddp_grad_ready;
        e->model->grad_ready_ctx = &e->ddp;
    }
    int rc = sl_model_backward(e->model, 1.0f / (float)e->cfg.grad_accum_steps);
    e->model->grad_ready = NULL;
    if (rc == 0 && e->distributed && last_micro) rc = sl_ddp_finish(&e->ddp);
    if (rc) return -1;
    e->loss_sum += l;
    e->micro_step++;
    if (loss) *loss = l;
    return 0;
}

int sl_engine_step_due(const sl_engine *e) { return e->micro_step >= e->cfg.grad_accum_steps; }

int sl_engine_step(sl_engine *e) {
    sl_model *m = e->model;
    if (e->micro_step == 0) return sl_errorf("engine: step called with no accumulated micro-batches");
    size_t n = m->layout.total;
    e->last_grad_norm = (float)sl_clip_grad_norm(m->grads, n, e->cfg.gradient_clipping);
    e->last_lr = sl_schedule_lr(&e->cfg.schedule, e->step);
    size_t b = e->shard_begin, end = e->shard_begin + e->shard_size;
    if (sl_optim_step(&e->cfg.optim, e->last_lr, e->step + 1, m->params + b, m->grads + b, e->optim_state,
                      &e->decay_mask, b, end))
        return -1;
    // ZeRO-1: every rank updated its own slice; gather the others' (in place)
    if (e->sharded && sl_comm_allgather(e->cfg.dp, m->params + b, m->params, e->shard_size, SL_DTYPE_F32)) return -1;
    double loss_sum = e->loss_sum;
    if (e->distributed) {
        if (sl_comm_allreduce(e->cfg.dp, &loss_sum, 1, SL_DTYPE_F64, SL_OP_SUM)) return -1;
        loss_sum /= sl_comm_size(e->cfg.dp);
    }
    e->last_loss = (float)(loss_sum / e->micro_step);
    e->loss_sum = 0.0;
    e->micro_step = 0;
    e->step++;
    sl_model_zero_grad(m);
    return 0;
}

// ---------------------------------------------------------------- checkpoints

static char *trainer_state_json(const sl_engine *e, const char *client_state_json) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "shardlm-trainer-state-1");
    cJSON_AddNumberToObject(root, "step", (double)e->step);
    cJSON_AddNumberToObject(root, "last_loss", e->last_loss);
    cJSON_AddStringToObject(root, "optimizer", sl_optim_name(e->cfg.optim.type));
    cJSON_AddStringToObject(root, "scheduler", sl_schedule_name(e->cfg.schedule.type));
    cJSON_AddNumberToObject(root, "num_parameters_flat", (double)e->model->layout.total);
    if (client_state_json) {
        cJSON *client = cJSON_Parse(client_state_json);
        if (client) cJSON_AddItemToObject(root, "client_state", client);
    }
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}

sl_engine_memory sl_engine_memory_use(const sl_engine *e) {
    sl_engine_memory mem = {e->model->capacity * sizeof(float), e->model->capacity * sizeof(float),
                            (size_t)e->n_optim_state * e->state_numel * sizeof(float)};
    return mem;
}

// Whole-model optimizer state: the engine's own buffers, or (ZeRO-1) every rank's slice gathered
// into temporary full buffers. The caller frees with release_full_state.
static int full_state(sl_engine *e, float **out) {
    for (int i = 0; i < e->n_optim_state; i++) out[i] = e->optim_state[i];
    if (!e->sharded) return 0;
    for (int i = 0; i < e->n_optim_state; i++) {
        out[i] = sl_malloc(e->padded_total * sizeof(float), "gathered optimizer state");
        if (!out[i] || sl_comm_allgather(e->cfg.dp, e->optim_state[i], out[i], e->shard_size, SL_DTYPE_F32)) {
            for (int j = 0; j <= i; j++) free(out[j]);
            return -1;
        }
    }
    return 0;
}

static void release_full_state(sl_engine *e, float **full) {
    if (e->sharded)
        for (int i = 0; i < e->n_optim_state; i++) free(full[i]);
}

// After rank 0 did something alone: every rank learns whether it worked (rank 0 keeps its message).
static int share_status(sl_engine *e, int rc, const char *what) {
    if (!e->distributed) return rc;
    int status = rc;
    if (sl_comm_broadcast(e->cfg.dp, &status, 1, SL_DTYPE_I32, 0)) return -1;
    if (status != 0 && sl_comm_rank(e->cfg.dp) != 0) return sl_errorf("rank 0 failed %s (see rank 0's error)", what);
    return status;
}

static int save_local(sl_engine *e, const char *root, const char *tag, const char *client_state_json, float **state);
static int load_local(sl_engine *e, const char *path, char **client_state_json, float **state);

int sl_engine_save(sl_engine *e, const char *root, const char *tag, const char *client_state_json) {
    float *state[2] = {NULL, NULL};
    if (full_state(e, state)) return -1;
    int rc = 0;
    if (!e->distributed || sl_comm_rank(e->cfg.dp) == 0) rc = save_local(e, root, tag, client_state_json, state);
    release_full_state(e, state);
    return share_status(e, rc, "to save the checkpoint");
}

int sl_engine_load(sl_engine *e, const char *path, char **client_state_json) {
    char *client = NULL;
    int rc = 0, rank0 = !e->distributed || sl_comm_rank(e->cfg.dp) == 0;
    if (client_state_json) *client_state_json = NULL;
    // the checkpoint holds whole-model optimizer state; a sharded engine reads it into full buffers
    float *state[2] = {e->optim_state[0], e->optim_state[1]};
    for (int i = 0; e->sharded && i < e->n_optim_state; i++) {
        state[i] = sl_calloc(e->padded_total, sizeof(float), "optimizer state being loaded");
        if (!state[i]) rc = -1;
    }
    if (rc == 0 && rank0) rc = load_local(e, path, &client, state);
    rc = share_status(e, rc, "to load the checkpoint");
    if (rc == 0 && e->distributed)
        for (int i = 0; i < e->n_optim_state && rc == 0; i++) {
            rc = sl_comm_broadcast(e->cfg.dp, state[i], e->model->layout.total, SL_DTYPE_F32, 0);
            if (rc == 0 && e->sharded)
                memcpy(e->optim_state[i], state[i] + e->shard_begin, e->shard_size * sizeof(float));
        }
    for (int i = 0; e->sharded && i < e->n_optim_state; i++) free(state[i]);
    if (rc) { free(client); return rc; }
    if (e->distributed) {
        // rank 0 read the files; everyone else receives the same state
        sl_comm *dp = e->cfg.dp;
        size_t n = e->model->layout.total;
        long long meta[2] = {(long long)e->step, client ? (long long)strlen(client) + 1 : 0};
        double last_loss = e->last_loss;
        if (sl_comm_broadcast(dp, e->model->params, n, SL_DTYPE_F32, 0) ||
            sl_comm_broadcast(dp, meta, 2, SL_DTYPE_I64, 0) || sl_comm_broadcast(dp, &last_loss, 1, SL_DTYPE_F64, 0)) {
            free(client);
            return -1;
        }
        if (!rank0 && meta[1] > 0) client = sl_calloc((size_t)meta[1], 1, "client state");
        if (meta[1] > 0 && (!client || sl_comm_broadcast(dp, client, (size_t)meta[1], SL_DTYPE_U8, 0))) {
            free(client);
            return -1;
        }
        e->step = meta[0];
        e->last_loss = (float)last_loss;
    }
    if (client_state_json) *client_state_json = client;
    else free(client);
    return 0;
}

static int save_local(sl_engine *e, const char *root, const char *tag, const char *client_state_json, float **moments) {
    if (e->micro_step != 0) return sl_errorf("checkpoint %s: cannot save in the middle of gradient accumulation", tag);
    char tmp[4096], path[4352];
    if (sl_ckpt_begin(root, tag, tmp, sizeof tmp)) return -1;
    const sl_model *m = e->model;
    if (sl_hf_save(tmp, &m->layout, m->params)) goto fail;
    if (e->n_optim_state > 0) {
        const char **names = state_names(e);
        const float *data[2] = {moments[0], moments[1]};
        size_t numel[2] = {m->layout.total, m->layout.total};
        snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp);
        if (sl_ckpt_save_tensors(path, e->n_optim_state, names, data, numel)) goto fail;
    }
    char *state = trainer_state_json(e, client_state_json);
    if (!state) { sl_errorf("out of memory writing trainer_state.json"); goto fail; }
    snprintf(path, sizeof path, "%s/trainer_state.json", tmp);
    int rc = sl_write_file_atomic(path, state, strlen(state));
    free(state);
    if (rc) goto fail;
    sl_fault_point(e->distributed ? sl_comm_rank(e->cfg.dp) : 0, e->step, "save");
    if (sl_ckpt_commit(root, tag, tmp)) goto fail;
    return 0;
fail:
    sl_error_context("saving checkpoint %s/%s", root, tag);
    char keep[2048];
    snprintf(keep, sizeof keep, "%s", sl_error());
    sl_ckpt_abort(tmp);
    return sl_errorf("%s", keep);
}

static int load_local(sl_engine *e, const char *path, char **client_state_json, float **state) {
    char dir[4096], file[4352];
    if (client_state_json) *client_state_json = NULL;
    if (sl_ckpt_resolve(path, dir, sizeof dir)) return -1;
    sl_model *m = e->model;
    sl_model_config cfg;
    if (sl_hf_load_config(dir, &cfg)) return -1;
    const sl_model_config *mc = &m->cfg;
    struct { const char *name; double ckpt, run; } fields[] = {
        {"architecture", cfg.arch, mc->arch}, {"vocab_size", cfg.vocab_size, mc->vocab_size},
        {"max positions", cfg.max_seq_len, mc->max_seq_len}, {"n_layer", cfg.n_layer, mc->n_layer},
        {"n_head", cfg.n_head, mc->n_head}, {"n_kv_head", cfg.n_kv_head, mc->n_kv_head},
        {"n_embd", cfg.n_embd, mc->n_embd}, {"n_inner", cfg.n_inner, mc->n_inner},
        {"norm epsilon", cfg.norm_eps, mc->norm_eps}, {"rope_theta", cfg.rope_theta, mc->rope_theta},
        {"tie_word_embeddings", cfg.tie_word_embeddings, mc->tie_word_embeddings},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (fields[i].ckpt != fields[i].run)
            return sl_errorf("%s: the checkpoint's model does not match this run's model: %s is %g there, %g here",
                             dir, fields[i].name, fields[i].ckpt, fields[i].run);
    if (sl_hf_load(dir, &m->layout, m->params)) return -1;
    snprintf(file, sizeof file, "%s/trainer_state.json", dir);
    size_t len;
    char *text = sl_read_text_file(file, &len);
    if (!text) return -1;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) return sl_errorf("%s: malformed JSON", file);
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(root, "step");
    const cJSON *opt = cJSON_GetObjectItemCaseSensitive(root, "optimizer");
    int rc = 0;
    if (!cJSON_IsNumber(step) || step->valuedouble < 0) rc = sl_errorf("%s: missing or invalid \"step\"", file);
    else if (!cJSON_IsString(opt) || strcmp(opt->valuestring, sl_optim_name(e->cfg.optim.type)) != 0)
        rc = sl_errorf("%s: checkpoint optimizer \"%s\" differs from this run's \"%s\"", file,
                       cJSON_IsString(opt) ? opt->valuestring : "?", sl_optim_name(e->cfg.optim.type));
    if (rc == 0) {
        e->step = (int64_t)step->valuedouble;
        const cJSON *ll = cJSON_GetObjectItemCaseSensitive(root, "last_loss");
        e->last_loss = cJSON_IsNumber(ll) ? (float)ll->valuedouble : 0.0f;
        const cJSON *client = cJSON_GetObjectItemCaseSensitive(root, "client_state");
        if (client && client_state_json) *client_state_json = cJSON_PrintUnformatted(client);
    }
    cJSON_Delete(root);
    if (rc) return rc;
    if (e->n_optim_state > 0) {
        snprintf(file, sizeof file, "%s/optimizer.safetensors", dir);
        size_t numel[2] = {m->layout.total, m->layout.total};
        if (sl_ckpt_load_tensors(file, e->n_optim_state, state_names(e), state, numel)) return -1;
    }
    e->micro_step = 0;
    e->loss_sum = 0.0;
    sl_model_zero_grad(m);
    return 0;
}
