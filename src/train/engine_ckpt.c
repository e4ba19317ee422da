// engine_ckpt.c: a training run's checkpoints: sl_engine_save and sl_engine_load (every rank in
// parallel, each with its own slice) and sl_checkpoint_consolidate (one file set from any of them).
// ROOT/<tag>/ holds
//   model.safetensors + config.json    full weights with Hugging Face names (rank 0); a LoRA run
//                                      writes adapter_model.safetensors + adapter_config.json (PEFT)
//                                      instead, its base staying where it was loaded from
//   optim_RRRRR_of_NNNNN.safetensors   one slice [begin, end) of the flat optimizer state, 1-D tensors
//                                      exp_avg / exp_avg_sq (Adam) or momentum_buffer (SGD); AdamW8bit:
//                                      its codes, block absmax and 32-bit state (engine_ckpt_8bit.c)
//   trainer_state.json                 step, settings and the caller's client state (rank 0)
//   manifest.json                      world size, ZeRO stage, every file with its range, size and
//                                      FNV-1a 64 checksum; written last, by rank 0
// Each ZeRO rank (stages 1-3) writes its own slice; without ZeRO rank 0 writes the whole state as one
// slice. All ranks write into one temporary directory that rank 0 created; rank 0 writes the manifest
// and commits (rename, then `latest`) only after every rank reported its shard complete, so a crash
// or a failed copy at any point leaves the previous checkpoint as `latest`.
// Loading checks the manifest's sizes and checksums, then every rank reads exactly the slice its own
// layout needs from whichever shard files hold it: a checkpoint saved at one world size and ZeRO
// stage loads at any other (DeepSpeed's "universal checkpoint").
// Data crosses between the engine's buffers (GPU memory under cuda) and the files only through host
// staging (engine_stage.c); no engine or model pointer changes. Peak host memory per rank: a save
// holds the fp32 weights on rank 0 (4 bytes a parameter; at ZeRO stages 1-2 under fp16/bf16 every
// rank holds them for the all-gather), a load holds them on rank 0; add one staging buffer
// (ckpt_stage_floats) for the optimizer state, which never has a whole host copy.
#include "shardlm/checkpoint.h"
#include "engine_internal.h"
#include "shardlm/error.h"
#include "shardlm/fault.h"
#include "shardlm/fileio.h"
#include "shardlm/hf_weights.h"
#include "shardlm/json_get.h"
#include "shardlm/manifest.h"
#include "shardlm/peft_adapter.h"
#include "shardlm/safetensors.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *STATE_NAMES[2][2] = {{"exp_avg", "exp_avg_sq"}, {"momentum_buffer", ""}};
static const char **state_names(const sl_engine *e) { return STATE_NAMES[e->cfg.optim.type == SL_OPTIM_SGD ? 1 : 0]; }

static int rank_of(const sl_engine *e) { return e->distributed ? sl_comm_rank(e->cfg.dp) : 0; }
static int world_of(const sl_engine *e) { return e->distributed ? sl_comm_size(e->cfg.dp) : 1; }

// The slice of the optimizer state this rank holds (and writes): its ZeRO shard clipped to the
// real parameters, or everything.
static void state_range(const sl_engine *e, size_t *begin, size_t *end) {
    size_t total = engine_total(e);
    *begin = e->sharded ? e->shard_begin : 0;
    *end = e->sharded ? e->shard_begin + e->shard_size : total;
    if (*end > total) *end = total;
    if (*begin > *end) *begin = *end;
}

static int writes_state(const sl_engine *e) { return e->sharded || rank_of(e) == 0; }

// The run keeps optimizer state: float buffers, or AdamW8bit's 8-bit state (engine_ckpt_8bit.c).
static int is_adam8(const sl_engine *e) { return e->cfg.optim.type == SL_OPTIM_ADAMW8BIT; }
static int has_state(const sl_engine *e) { return e->n_optim_state > 0 || is_adam8(e); }

// After rank 0 did something alone: every rank learns whether it worked (rank 0 keeps its message).
static int share_status(sl_engine *e, int rc, const char *what) {
    if (!e->distributed) return rc;
    int status = rc;
    if (sl_comm_broadcast(e->cfg.dp, &status, 1, SL_DTYPE_I32, 0)) return -1;
    if (status != 0 && sl_comm_rank(e->cfg.dp) != 0) return sl_errorf("rank 0 failed %s (see rank 0's error)", what);
    return status;
}

// A path chosen by rank 0, given to every rank.
static int share_path(sl_engine *e, char *path, size_t cap) {
    if (!e->distributed) return 0;
    return sl_comm_broadcast(e->cfg.dp, path, cap, SL_DTYPE_U8, 0);
}

static char *trainer_state_json(const sl_engine *e, const char *client_state_json) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "shardlm-trainer-state-1");
    cJSON_AddNumberToObject(root, "step", (double)e->step);
    cJSON_AddNumberToObject(root, "last_loss", e->last_loss);
    cJSON_AddStringToObject(root, "optimizer", sl_optim_name(e->cfg.optim.type));
    cJSON_AddStringToObject(root, "scheduler", sl_schedule_name(e->cfg.schedule.type));
    cJSON_AddNumberToObject(root, "num_parameters_flat", (double)engine_total(e));
    engine_scaler_to_json(e, root);
    if (client_state_json) {
        cJSON *client = cJSON_Parse(client_state_json);
        if (client) cJSON_AddItemToObject(root, "client_state", client);
    }
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}

typedef struct { long long writer, begin, end, bytes, hash, status; } shard_record;

static void add_file(cJSON *arr, const char *name, const shard_record *r) {
    char hex[24];
    snprintf(hex, sizeof hex, "%016" PRIx64, (uint64_t)r->hash);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "file", name);
    if (r->end >= r->begin && r->writer >= 0) {
        cJSON_AddNumberToObject(o, "begin", (double)r->begin);
        cJSON_AddNumberToObject(o, "end", (double)r->end);
        cJSON_AddNumberToObject(o, "rank", (double)r->writer);
    }
    cJSON_AddNumberToObject(o, "bytes", (double)r->bytes);
    cJSON_AddStringToObject(o, "fnv1a64", hex);
    cJSON_AddItemToArray(arr, o);
}

static void shard_name(char *buf, size_t cap, int r, int n) { snprintf(buf, cap, "optim_%05d_of_%05d.safetensors", r, n); }

// Rank 0's part: weights, trainer state, manifest, then commit.
static int finish_on_rank0(sl_engine *e, const float *params, const char *root, const char *tag, const char *tmp,
                           const char *client, const shard_record *recs, int world) {
    char path[4400], name[64];
    for (int r = 0; r < world; r++)
        if (recs[r].status != 0) return sl_errorf("rank %d failed to write its optimizer shard (see its error)", r);
    const sl_lora *lora = e->model->lora;  // with adapters: they are the weights (PEFT's files), the base frozen
    if (lora ? sl_peft_save(tmp, lora, params) : sl_hf_save(tmp, &e->model->layout, params)) return -1;
    char *state = trainer_state_json(e, client);
    if (!state) return sl_errorf("out of memory writing trainer_state.json");
    snprintf(path, sizeof path, "%s/trainer_state.json", tmp);
    int rc = sl_write_file_atomic(path, state, strlen(state));
    free(state);
    if (rc) return -1;

    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "format", SL_MANIFEST_FORMAT);
    cJSON_AddNumberToObject(m, "step", (double)e->step);
    cJSON_AddNumberToObject(m, "world_size", world);
    cJSON_AddNumberToObject(m, "zero_stage", e->sharded ? e->cfg.zero_stage : 0);
    cJSON_AddNumberToObject(m, "shard_size", (double)e->shard_size);
    cJSON_AddNumberToObject(m, "num_parameters_flat", (double)engine_total(e));
    cJSON_AddStringToObject(m, "optimizer", sl_optim_name(e->cfg.optim.type));
    cJSON *names = cJSON_AddArrayToObject(m, "state_tensors");
    for (int i = 0; i < e->n_optim_state; i++) cJSON_AddItemToArray(names, cJSON_CreateString(state_names(e)[i]));
    for (int i = 0; i < 6 && is_adam8(e); i++) cJSON_AddItemToArray(names, cJSON_CreateString(SL_ADAM8_TENSORS[i]));
    cJSON *shards = cJSON_AddArrayToObject(m, "optimizer_shards");
    int n_writers = 0;
    for (int r = 0; r < world; r++) n_writers += recs[r].writer >= 0;
    for (int r = 0, k = 0; r < world && has_state(e); r++) {
        if (recs[r].writer < 0) continue;
        shard_name(name, sizeof name, k++, n_writers);
        add_file(shards, name, &recs[r]);
    }
    cJSON *files = cJSON_AddArrayToObject(m, "files");
    const char *plain[3] = {lora ? "adapter_model.safetensors" : "model.safetensors",
                            lora ? "adapter_config.json" : "config.json", "trainer_state.json"};
    for (int i = 0; i < 3 && rc == 0; i++) {
        shard_record f = {-1, 0, -1, 0, 0, 0};
        uint64_t h, b;
        snprintf(path, sizeof path, "%s/%s", tmp, plain[i]);
        rc = sl_file_fnv1a64(path, SL_FNV1A64_INIT, &h, &b);
        f.hash = (long long)h;
        f.bytes = (long long)b;
        if (rc == 0) add_file(files, plain[i], &f);
    }
    char *text = rc == 0 ? cJSON_Print(m) : NULL;
    cJSON_Delete(m);
    if (rc) return -1;
    if (!text) return sl_errorf("out of memory writing manifest.json");
    snprintf(path, sizeof path, "%s/manifest.json", tmp);
    rc = sl_write_file_atomic(path, text, strlen(text));
    free(text);
    if (rc) return -1;
    sl_fault_point(0, e->step, "save");
    return sl_ckpt_commit(root, tag, tmp);
}

static int save_impl(sl_engine *e, const char *root, const char *tag, const char *client_state_json,
                     const float *full);
static int load_impl(sl_engine *e, const char *path, char **client_state_json);

int sl_engine_save(sl_engine *e, const char *root, const char *tag, const char *client_state_json) {
    if (e->micro_step != 0) return sl_errorf("checkpoint %s: cannot save in the middle of gradient accumulation", tag);
    // model.safetensors holds the fp32 weights: the master under fp16/bf16, gathered under ZeRO,
    // downloaded into host memory on rank 0
    float *full = NULL;
    int rc = engine_weights_for_save(e, &full);
    // a failed copy (or any earlier call) recorded by the backend: reported before anything is
    // written, and agreed on by every rank
    if (rc == 0) rc = engine_backend_agrees(e);
    if (rc) sl_error_context("checkpoint %s (step %lld): copying the weights to host memory", tag, (long long)e->step);
    if (rc == 0) rc = save_impl(e, root, tag, client_state_json, full);
    free(full);
    return rc;
}

int sl_engine_load(sl_engine *e, const char *path, char **client_state_json) {
    int rc = load_impl(e, path, client_state_json);
    if (rc == 0) {
        sl_model_zero_grad(e->model);
        engine_capture_master(e);  // the weights just read are fp32: the master, rounded for the model
        rc = sl_model_params_changed(e->model);  // and the model's bf16 weight copy, where it has one
    }
    // that work finished on every rank without a failure recorded by the backend
    if (rc == 0 && engine_backend_agrees(e))
        rc = sl_error_context("loading checkpoint %s (step %lld)", path, (long long)e->step);
    return rc;
}

static int save_impl(sl_engine *e, const char *root, const char *tag, const char *client_state_json,
                     const float *full) {
    int rank = rank_of(e), world = world_of(e), rc = 0;
    char tmp[4096] = "";
    if (rank == 0) rc = sl_ckpt_begin(root, tag, tmp, sizeof tmp);
    if ((rc = share_status(e, rc, "to create the checkpoint directory")) != 0) return rc;
    if (share_path(e, tmp, sizeof tmp)) return -1;

    // every writer: its optimizer-state slice, then its record (range, size, checksum)
    shard_record mine = {-1, 0, 0, 0, 0, 0};
    char own_error[2048] = "";
    if (writes_state(e) && has_state(e)) {
        size_t b, end;
        state_range(e, &b, &end);
        int index = e->sharded ? rank : 0, count = e->sharded ? world : 1;
        char name[64], path[4200];
        shard_name(name, sizeof name, index, count);
        snprintf(path, sizeof path, "%s/%s", tmp, name);
        const float *data[2];
        size_t numel[2];
        for (int i = 0; i < e->n_optim_state; i++) {
            data[i] = e->optim_state[i] + (b - (e->sharded ? e->shard_begin : 0));
            numel[i] = end - b;
        }
        char what[256];
        snprintf(what, sizeof what, "checkpoint %s (step %lld): optimizer state", tag, (long long)e->step);
        uint64_t h = 0, bytes = 0;
        mine.writer = rank;
        mine.begin = (long long)b;
        mine.end = (long long)end;
        mine.status = (is_adam8(e) ? engine_adam8_write(&e->adam8_plan, &e->adam8, e->cfg.optim.min_8bit_size, path)
                                   : engine_stage_write(e, path, e->n_optim_state, state_names(e), data, numel, what)) ||
                      sl_file_fnv1a64(path, SL_FNV1A64_INIT, &h, &bytes);
        mine.hash = (long long)h;
        mine.bytes = (long long)bytes;
        if (mine.status) snprintf(own_error, sizeof own_error, "%s", sl_error());
        // rank 0 returns its own message; another rank's is printed here, where it is known
        if (mine.status && rank != 0) fprintf(stderr, "error: [rank %d] %s\n", rank, own_error);
    }
    shard_record *recs = sl_calloc((size_t)world, sizeof *recs, "checkpoint records");
    if (!recs) return -1;
    if (e->distributed) rc = sl_comm_allgather(e->cfg.dp, &mine, recs, 6, SL_DTYPE_I64);
    else recs[0] = mine;
    if (rc == 0 && rank == 0) {
        rc = mine.status ? sl_errorf("%s", own_error)
                         : finish_on_rank0(e, full, root, tag, tmp, client_state_json, recs, world);
        if (rc) {
            char keep[2048];
            snprintf(keep, sizeof keep, "saving checkpoint %s/%s: %s", root, tag, sl_error());
            sl_ckpt_abort(tmp);
            sl_errorf("%s", keep);
        }
    }
    free(recs);
    return share_status(e, rc, "to save the checkpoint");
}

// ---------------------------------------------------------------- loading

// Fills this rank's optimizer state slice from the shard files that overlap it.
static int read_state_slice(sl_engine *e, const char *dir, const sl_manifest_shard *refs, int n) {
    size_t b, end;
    state_range(e, &b, &end);
    size_t base = e->sharded ? e->shard_begin : 0;
    char what[4200];
    snprintf(what, sizeof what, "loading checkpoint %s (step %lld): optimizer state", dir, (long long)e->step);
    for (int s = 0; s < n; s++) {
        size_t lo = refs[s].begin > b ? refs[s].begin : b, hi = refs[s].end < end ? refs[s].end : end;
        if (lo >= hi) continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, refs[s].file);
        if (is_adam8(e)) {
            int n_tensors;
            const sl_tensor_info *tensors = engine_tensors(e, &n_tensors);
            if (engine_adam8_read(tensors, n_tensors, engine_total(e), e->cfg.optim.min_8bit_size, path, refs[s].begin,
                                  refs[s].end, &e->adam8_plan, &e->adam8))
                return sl_error_context("%s", what);
            continue;
        }
        sl_st_file f;
        if (sl_st_open(&f, path)) return -1;
        int rc = 0;
        for (int i = 0; i < e->n_optim_state && rc == 0; i++) {
            int idx = sl_st_find(&f, state_names(e)[i]);
            if (idx < 0) rc = sl_errorf("%s: no tensor \"%s\"", path, state_names(e)[i]);
            else if (f.tensors[idx].numel != refs[s].end - refs[s].begin)
                rc = sl_errorf("%s: tensor \"%s\" holds %zu elements, the manifest says %zu", path, state_names(e)[i],
                               f.tensors[idx].numel, refs[s].end - refs[s].begin);
            else rc = engine_stage_read(e, &f, idx, lo - refs[s].begin, hi - lo, e->optim_state[i] + (lo - base),
                                        what);
        }
        sl_st_close(&f);
        if (rc) return -1;
    }
    return 0;
}

// Rank 0: model config check, weights, trainer state, manifest verification.
static int load_on_rank0(sl_engine *e, float *params, const char *dir, char **client_state_json) {
    char file[4400];
    sl_model *m = e->model;
    sl_model_config cfg;
    char where[4200];
    snprintf(where, sizeof where, "%s: the checkpoint's model does not match this run's model", dir);
    // a LoRA run's checkpoint holds the adapters (checked against this run's by name, shape and settings)
    snprintf(file, sizeof file, "%s/adapter_config.json", dir);
    if (!m->lora && access(file, F_OK) == 0)
        return sl_errorf("%s holds LoRA adapters, this run trains the whole model: resume with the run's LoRA settings "
                         "(--lora-* flags or the config's \"lora\" block)", dir);
    if (!m->lora && (sl_hf_load_config(dir, &cfg) || sl_config_compare(&cfg, &m->cfg, where))) return -1;
    sl_manifest man;
    if (sl_manifest_load(&man, dir, engine_total(e), e->cfg.skip_verify ? SL_VERIFY_NONE : SL_VERIFY_ALL)) return -1;
    sl_manifest_free(&man);
    if (m->lora ? sl_peft_read_weights(dir, m->lora, params) : sl_hf_load(dir, &m->layout, params)) return -1;
    snprintf(file, sizeof file, "%s/trainer_state.json", dir);
    cJSON *root = sl_json_read_strict(file);
    if (!root) return -1;
    const cJSON *opt = cJSON_GetObjectItemCaseSensitive(root, "optimizer");
    int64_t step = 0;
    int rc = sl_json_get_i64(root, "step", &step, 1, 0, SL_JSON_INT_EXACT, file);
    if (rc == 0 && (!cJSON_IsString(opt) || strcmp(opt->valuestring, sl_optim_name(e->cfg.optim.type)) != 0))
        rc = sl_errorf("%s: checkpoint optimizer \"%s\" differs from this run's \"%s\"", file,
                       cJSON_IsString(opt) ? opt->valuestring : "?", sl_optim_name(e->cfg.optim.type));
    if (rc == 0) {
        e->step = step;
        const cJSON *ll = cJSON_GetObjectItemCaseSensitive(root, "last_loss");
        e->last_loss = cJSON_IsNumber(ll) ? (float)ll->valuedouble : 0.0f;
        const cJSON *client = cJSON_GetObjectItemCaseSensitive(root, "client_state");
        if (client && client_state_json) *client_state_json = cJSON_PrintUnformatted(client);
        rc = engine_scaler_from_json(e, root, file);
    }
    cJSON_Delete(root);
    return rc;
}

// Collective: rank 0's step, last loss, client state and loss scaler to every rank.
static int share_trainer_state(sl_engine *e, char **client) {
    if (!e->distributed) return 0;
    sl_comm *dp = e->cfg.dp;
    long long meta[2] = {(long long)e->step, *client ? (long long)strlen(*client) + 1 : 0};
    double last_loss = e->last_loss;
    if (sl_comm_broadcast(dp, meta, 2, SL_DTYPE_I64, 0) || sl_comm_broadcast(dp, &last_loss, 1, SL_DTYPE_F64, 0))
        return -1;
    if (!*client && meta[1] > 0 && !(*client = sl_calloc((size_t)meta[1], 1, "client state"))) return -1;
    if (meta[1] > 0 && sl_comm_broadcast(dp, *client, (size_t)meta[1], SL_DTYPE_U8, 0)) return -1;
    e->step = meta[0];
    e->last_loss = (float)last_loss;
    return engine_scaler_broadcast(e);
}

// Collective: the weights rank 0 read (full, host memory; NULL elsewhere) into every rank's buffers.
// ZeRO-3 scatters them unit by unit through a window; otherwise rank 0 uploads them into the model's
// buffer, which is then broadcast in the backend's memory (NCCL on GPUs), as init does.
static int place_weights(sl_engine *e, const float *full, const char *path) {
    sl_model *m = e->model;
    size_t n = engine_total(e);
    int rc;
    if (e->sharded && e->zero.stage == 3) {
        rc = sl_zero_scatter_params(&e->zero, full, 0);
        if (engine_backend_agrees(e)) rc = -1;  // every rank takes part, whatever the scatter said
    } else {
        if (full) m->ops->upload(engine_params(e), full, n * sizeof(float));
        rc = engine_backend_agrees(e);  // a failed upload is named before the broadcast spreads it
        if (rc == 0 && e->distributed)
            rc = sl_comm_order_after(e->cfg.dp, m->ops->stream()) ||
                 sl_comm_broadcast(e->cfg.dp, engine_params(e), n, SL_DTYPE_F32, 0);
    }
    if (rc) sl_error_context("loading checkpoint %s (step %lld): copying the weights to the %s backend", path,
                             (long long)e->step, m->ops->name);
    return rc ? -1 : 0;
}

// Collective: every rank reads its own slice of the optimizer state (rank 0 verified the files) and
// all learn whether every rank succeeded.
static int read_own_state(sl_engine *e, const char *dir) {
    int mine = 0;
    if (has_state(e)) {
        sl_manifest man;
        mine = sl_manifest_load(&man, dir, engine_total(e), SL_VERIFY_NONE) ||
               read_state_slice(e, dir, man.shards, man.n_shards);
        sl_manifest_free(&man);
        // rank 0 returns its own message; another rank's is printed here, where it is known
        if (mine && rank_of(e) != 0) fprintf(stderr, "error: [rank %d] %s\n", rank_of(e), sl_error());
    }
    int any = mine;
    if (e->distributed && sl_comm_allreduce(e->cfg.dp, &any, 1, SL_DTYPE_I32, SL_OP_MAX)) any = 1;
    if (!any) return 0;
    return mine ? -1 : sl_errorf("another rank failed to read its optimizer state from %s", dir);
}

static int load_impl(sl_engine *e, const char *path, char **client_state_json) {
    char dir[4096] = "";
    char *client = NULL;
    int rc = 0;
    if (client_state_json) *client_state_json = NULL;
    // rank 0 reads the weights into host memory; place_weights hands them to every rank's buffers
    float *full = NULL;
    if (rank_of(e) == 0) {
        rc = sl_ckpt_resolve(path, dir, sizeof dir);
        if (rc == 0 && !(full = sl_calloc(e->padded_total, sizeof(float), "checkpoint weights"))) rc = -1;
        if (rc == 0) rc = load_on_rank0(e, full, dir, &client);
    }
    rc = share_status(e, rc, "to load the checkpoint");
    if (rc == 0) rc = share_path(e, dir, sizeof dir);
    if (rc == 0) rc = share_trainer_state(e, &client);
    if (rc == 0) rc = place_weights(e, full, path);
    free(full);
    if (rc == 0) rc = read_own_state(e, dir);
    if (rc) {
        free(client);
        return -1;
    }
    e->micro_step = 0;
    e->loss_sum = 0.0;
    if (e->sharded) sl_zero_zero_grads(&e->zero);
    if (client_state_json) *client_state_json = client;
    else free(client);
    return 0;
}

// ---------------------------------------------------------------- consolidation

// AdamW8bit: every shard's state into one plan of the whole buffer (bitsandbytes' per-tensor blocks,
// whatever world size saved it), written as TMP/optimizer.safetensors.
static int consolidate_adam8(const sl_param_layout *L, const char *dir, const sl_manifest_shard *refs, int n,
                             const char *tmp) {
    char file[4400];
    if (n < 1) return sl_errorf("%s: no optimizer shards", dir);
    snprintf(file, sizeof file, "%s/%s", dir, refs[0].file);
    sl_st_file f;
    if (sl_st_open(&f, file)) return -1;
    long long min_size = engine_adam8_file_min_size(&f);
    sl_st_close(&f);
    if (min_size < 0) return -1;
    sl_optim_config cfg;
    sl_optim_defaults(&cfg);
    cfg.min_8bit_size = min_size;
    sl_adam8_plan plan;
    sl_adam8_state st = {0};
    int rc = sl_adam8_plan_build(&plan, L->tensors, L->n_tensors, L->total, &cfg, 0, L->total) ||
             sl_adam8_state_alloc(&st, &plan);
    for (int s = 0; rc == 0 && s < n; s++) {
        snprintf(file, sizeof file, "%s/%s", dir, refs[s].file);
        rc = engine_adam8_read(L->tensors, L->n_tensors, L->total, min_size, file, refs[s].begin, refs[s].end, &plan,
                               &st);
    }
    snprintf(file, sizeof file, "%s/optimizer.safetensors", tmp);
    if (rc == 0) rc = engine_adam8_write(&plan, &st, min_size, file);
    sl_adam8_state_free(&st);
    sl_adam8_plan_free(&plan);
    return rc ? -1 : 0;
}

int sl_checkpoint_consolidate(const char *path, const char *out_dir, int with_optimizer) {
    char dir[4096], tmp[4200], file[4400];
    if (sl_ckpt_resolve(path, dir, sizeof dir)) return -1;
    sl_model_config cfg;
    sl_param_layout L;
    snprintf(file, sizeof file, "%s/adapter_config.json", dir);
    if (access(file, F_OK) == 0)
        return sl_errorf("%s holds LoRA adapters (adapter_model.safetensors, adapter_config.json), which PEFT loads as "
                         "they are; `shardlm merge --model BASE --adapter %s --output DIR` makes a full model", dir, dir);
    if (sl_hf_load_config(dir, &cfg) || sl_layout_build(&L, &cfg)) return -1;
    float *params = NULL, *state[2] = {NULL, NULL};
    sl_manifest man;
    // the whole checkpoint is verified, optimizer shards too: an incomplete or damaged one is refused
    // rather than consolidated
    int rc = sl_manifest_load(&man, dir, L.total, SL_VERIFY_ALL);
    const sl_manifest_shard *refs = man.shards;
    int adam8 = rc == 0 && man.n_state > 0 && strcmp(man.state_names[0], SL_ADAM8_TENSORS[0]) == 0;
    int n = man.n_shards, n_state = rc == 0 && with_optimizer && !adam8 ? man.n_state : 0;
    const char *names[2] = {man.state_names[0], man.state_names[1]};
    params = rc == 0 ? sl_calloc(L.total, sizeof(float), "parameters") : NULL;
    if (rc == 0 && (!params || sl_hf_load(dir, &L, params))) rc = -1;
    for (int i = 0; rc == 0 && i < n_state; i++)
        if (!(state[i] = sl_calloc(L.total, sizeof(float), "optimizer state"))) rc = -1;
    for (int s = 0; rc == 0 && s < n && n_state > 0; s++) {
        sl_st_file f;
        snprintf(file, sizeof file, "%s/%s", dir, refs[s].file);
        if (sl_st_open(&f, file)) { rc = -1; break; }
        for (int i = 0; rc == 0 && i < n_state; i++) {
            int idx = sl_st_find(&f, names[i]);
            if (idx < 0) rc = sl_errorf("%s: no tensor \"%s\"", file, names[i]);
            else rc = sl_st_read_f32_range(&f, idx, 0, refs[s].end - refs[s].begin, state[i] + refs[s].begin);
        }
        sl_st_close(&f);
    }
    // write everything into a temporary sibling, then rename it into place
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", out_dir, (int)getpid());
    if (rc == 0 && sl_hf_save(tmp, &L, params)) rc = -1;
    if (rc == 0 && with_optimizer && adam8) rc = consolidate_adam8(&L, dir, refs, n, tmp);
    if (rc == 0 && n_state > 0) {
        snprintf(file, sizeof file, "%s/optimizer.safetensors", tmp);
        const float *data[2] = {state[0], state[1]};
        size_t numel[2] = {L.total, L.total};
        rc = sl_ckpt_save_tensors(file, n_state, names, data, numel);
    }
    if (rc == 0 && rename(tmp, out_dir) != 0) rc = sl_errorf("%s: cannot rename %s into place (does it exist already?)", out_dir, tmp);
    if (rc == 0) rc = sl_fsync_dir(".");
    if (rc) {
        char keep[2048];
        snprintf(keep, sizeof keep, "%s", sl_error());
        sl_remove_tree(tmp);
        sl_errorf("%s", keep);
    }
    sl_manifest_free(&man);
    free(params);
    free(state[0]);
    free(state[1]);
    sl_layout_free(&L);
    return rc;
}
