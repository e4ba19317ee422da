// resume.c: the checkpoint's saved run against this run (see resume.h). The saved numbers are read
// as typed, range-checked fields; the position arithmetic is done in double precision, as windows
// of the old run's batch shape counted in the new one's.
#include "shardlm/resume.h"
#include "shardlm/error.h"
#include "shardlm/json_get.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sl_resume_state_parse(sl_resume_state *s, const char *client_state_json) {
    memset(s, 0, sizeof *s);
    s->grad_accum = 1;
    s->shuffle = 1;
    cJSON *root = client_state_json ? cJSON_Parse(client_state_json) : NULL;
    const cJSON *ld = root ? cJSON_GetObjectItemCaseSensitive(root, "loader") : NULL;
    const cJSON *cfg = root ? cJSON_GetObjectItemCaseSensitive(root, "config") : NULL;
    const cJSON *own = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "shardlm") : NULL;
    int rc = 0;
    char *pos = ld ? cJSON_PrintUnformatted(ld) : NULL;
    if (!ld || !own) rc = sl_errorf("checkpoint has no saved loader position and configuration");
    else if (!pos || sl_loader_position_from_json(pos, &s->position)) rc = -1;
    free(pos);
    // the saved batch shape rescales the position: integers in range, or the checkpoint is refused
    const char *w = "trainer_state.json client_state.config", *wo = "trainer_state.json client_state.config.shardlm";
    if (rc == 0 && (sl_json_get_i64(cfg, "train_micro_batch_size_per_gpu", &s->micro_batch, 1, 1, 1000000000, w) ||
                    sl_json_get_i64(cfg, "gradient_accumulation_steps", &s->grad_accum, 0, 1, 1000000000, w) ||
                    sl_json_get_i64(cfg, "train_batch_size", &s->train_batch_size, 1, 1, 1000000000, w) ||
                    sl_json_get_i64(own, "seq_len", &s->seq_len, 1, 1, 1000000000, wo) ||
                    sl_json_get_i64(own, "seed", &s->seed, 1, 0, SL_JSON_INT_EXACT, wo) ||
                    sl_json_get_bool(own, "shuffle", &s->shuffle, wo) ||
                    sl_json_get_int(own, "threads", &s->threads, 0, 0, wo)))
        rc = -1;
    if (rc == 0) {
        const cJSON *data = cJSON_GetObjectItemCaseSensitive(own, "data");
        if (!cJSON_IsString(data)) rc = sl_errorf("%s: \"data\" must be the data directory (a string)", wo);
        else if (sl_json_get_string(own, "data", s->data, sizeof s->data, wo)) rc = -1;
    }
    if (rc == 0 && sl_quant_config_parse(cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config"), &s->quant,
                                         "trainer_state.json client_state.config.quantization_config"))
        rc = -1;
    cJSON_Delete(root);
    return rc;
}

// "nf4 (blocks of 64, double-quantised scales)" or "full-precision" for the refusal below.
static const char *base_words(const sl_quant_config *q, char *buf, size_t cap) {
    if (q->type == SL_QUANT_NONE) return "full-precision";
    return sl_quant_config_describe(q, buf, cap);
}

static void add_warning(sl_resume_plan *p, const char *text) {
    snprintf(p->warnings[p->n_warnings++], sizeof p->warnings[0], "%s", text);
}

int sl_resume_check(const sl_resume_state *s, const sl_train_config *c, int64_t batches_per_epoch,
                    sl_resume_plan *plan) {
    memset(plan, 0, sizeof *plan);
    if (s->seq_len != c->seq_len)
        return sl_errorf("checkpoint was trained with seq_len %lld, this run uses %d", (long long)s->seq_len, c->seq_len);
    if ((uint64_t)s->seed != c->seed)
        return sl_errorf("checkpoint was trained with seed %lld, this run uses %llu", (long long)s->seed,
                         (unsigned long long)c->seed);
    if (s->shuffle != c->shuffle)
        return sl_errorf("checkpoint was trained with%s shuffling, this run %s", s->shuffle ? "" : "out",
                         c->shuffle ? "shuffles" : "does not");
    if (strcmp(s->data, c->data) != 0)
        return sl_errorf("checkpoint was trained on data %s, this run reads %s", s->data, c->data);
    if (s->quant.type != c->quant.type || (s->quant.type != SL_QUANT_NONE && s->quant.type != SL_QUANT_INT8 &&
                                           (s->quant.blocksize != c->quant.blocksize ||
                                            s->quant.double_quant != c->quant.double_quant))) {
        char a[96], b[96];
        return sl_errorf("checkpoint was trained on a %s base, this run's base is %s (resume with the same "
                         "--quantize / quantization_config: the adapters were fitted to that base)",
                         base_words(&s->quant, a, sizeof a), base_words(&c->quant, b, sizeof b));
    }
    if (c->shuffle && s->micro_batch != c->micro_batch)
        return sl_errorf("checkpoint was trained with micro batch %lld, this run uses %d (with shuffling the window "
                         "order depends on it; keep it, or change ranks/accumulation instead)",
                         (long long)s->micro_batch, c->micro_batch);
    // windows per global batch, then and now (the old world size may come out fractional from a
    // hand-edited train_batch_size: the divisibility check below then refuses it)
    double mb = (double)s->micro_batch, world = (double)s->train_batch_size / (mb * (double)s->grad_accum);
    double old_windows = world * mb, new_windows = (double)c->world_size * c->micro_batch;
    int64_t batch = s->position.batch;
    if (fmod((double)batch * old_windows, new_windows) != 0.0)
        return sl_errorf("the checkpoint's data position (%lld batches of %g windows) is not a whole number of this "
                         "run's batches of %g windows", (long long)batch, old_windows, new_windows);
    if ((double)batch * old_windows / new_windows >= (double)batches_per_epoch)
        return sl_errorf("the checkpoint's data position (batch %lld of %g windows) lies past this run's epoch of "
                         "%lld batches of %g windows", (long long)batch, old_windows, (long long)batches_per_epoch,
                         new_windows);
    plan->position = s->position;
    plan->position.batch = (int64_t)((double)batch * old_windows / new_windows);
    char line[160];
    if (s->train_batch_size != c->train_batch_size) {
        snprintf(line, sizeof line, "train_batch_size changes from %lld to %d on resume", (long long)s->train_batch_size,
                 c->train_batch_size);
        add_warning(plan, line);
    }
    if (s->threads != c->threads)
        add_warning(plan, "thread count differs from the checkpoint's run: results will not be bit-identical to an "
                          "uninterrupted run");
    return 0;
}
