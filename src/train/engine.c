// engine.c: the single-process training step and its checkpoints (see engine.h).
// Invariants: grads hold the sum over the micro-batches of this step, each scaled by
// 1/grad_accum_steps; grads are zero whenever micro_step == 0; `step` counts applied steps.
#include "shardlm/engine.h"
#include "shardlm/checkpoint.h"
#include "shardlm/error.h"
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

int sl_engine_init(sl_engine *e, sl_model *model, const sl_engine_config *cfg) {
    memset(e, 0, sizeof *e);
    e->model = model;
    e->cfg = *cfg;
    if (cfg->micro_batch <= 0 || cfg->grad_accum_steps <= 0)
        return sl_errorf("engine: micro batch (%d) and gradient accumulation steps (%d) must be positive",
                         cfg->micro_batch, cfg->grad_accum_steps);
    if (sl_decay_mask_from_layout(&e->decay_mask, &model->layout, cfg->optim.decay_all)) return -1;
    e->n_optim_state = sl_optim_num_state_buffers(&cfg->optim);
    for (int i = 0; i < e->n_optim_state; i++) {
        e->optim_state[i] = sl_calloc(model->layout.total, sizeof(float), "optimizer state");
        if (!e->optim_state[i]) { sl_engine_free(e); return -1; }
    }
    sl_model_zero_grad(model);
    return 0;
}

void sl_engine_free(sl_engine *e) {
    for (int i = 0; i < 2; i++) free(e->optim_state[i]);
    sl_decay_mask_free(&e->decay_mask);
    memset(e, 0, sizeof *e);
}

int sl_engine_forward_backward(sl_engine *e, const int *inputs, const int *targets, int B, int T, float *loss) {
    float l;
    if (sl_model_forward(e->model, inputs, targets, B, T, &l)) return -1;
    if (sl_model_backward(e->model, 1.0f / (float)e->cfg.grad_accum_steps)) return -1;
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
    if (sl_optim_step(&e->cfg.optim, e->last_lr, e->step + 1, m->params, m->grads, e->optim_state,
                      &e->decay_mask, 0, n))
        return -1;
    e->last_loss = (float)(e->loss_sum / e->micro_step);
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

int sl_engine_save(sl_engine *e, const char *root, const char *tag, const char *client_state_json) {
    if (e->micro_step != 0) return sl_errorf("checkpoint %s: cannot save in the middle of gradient accumulation", tag);
    char tmp[4096], path[4352];
    if (sl_ckpt_begin(root, tag, tmp, sizeof tmp)) return -1;
    const sl_model *m = e->model;
    if (sl_hf_save(tmp, &m->layout, m->params)) goto fail;
    if (e->n_optim_state > 0) {
        const char **names = state_names(e);
        const float *data[2] = {e->optim_state[0], e->optim_state[1]};
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
    if (sl_ckpt_commit(root, tag, tmp)) goto fail;
    return 0;
fail:
    sl_error_context("saving checkpoint %s/%s", root, tag);
    char keep[2048];
    snprintf(keep, sizeof keep, "%s", sl_error());
    sl_ckpt_abort(tmp);
    return sl_errorf("%s", keep);
}

int sl_engine_load(sl_engine *e, const char *path, char **client_state_json) {
    char dir[4096], file[4352];
    if (client_state_json) *client_state_json = NULL;
    if (sl_ckpt_resolve(path, dir, sizeof dir)) return -1;
    sl_model *m = e->model;
    sl_model_config cfg;
    if (sl_hf_load_config(dir, &cfg)) return -1;
    sl_param_layout check;
    if (sl_layout_build(&check, &cfg)) return -1;
    size_t total = check.total;
    sl_layout_free(&check);
    if (total != m->layout.total || cfg.arch != m->cfg.arch || cfg.n_layer != m->cfg.n_layer)
        return sl_errorf("%s: checkpoint model (%zu flat parameters, %d layers) does not match this run's model "
                         "(%zu, %d layers)", dir, total, cfg.n_layer, m->layout.total, m->cfg.n_layer);
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
        if (sl_ckpt_load_tensors(file, e->n_optim_state, state_names(e), e->optim_state, numel)) return -1;
    }
    e->micro_step = 0;
    e->loss_sum = 0.0;
    sl_model_zero_grad(m);
    return 0;
}
