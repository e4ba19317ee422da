// schedule.c: DeepSpeed's WarmupLR / WarmupDecayLR / WarmupCosineLR and the constant schedule.
// Invariants: the formulas are DeepSpeed's, term for term, in double precision (as Python's), so
// sl_schedule_lr returns DeepSpeed's value to the last bit or so; warmup_num_steps >= 2 after parsing
// (DeepSpeed's max(2, warmup_num_steps)); the schedule is a pure function of the step (no state).
// Any int64 step or iteration is safe: differences of steps are taken in double precision (exact
// below 2^53, where every real step count lies), never as int64 that could overflow.
#include "shardlm/schedule.h"
#include "shardlm/error.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const double PI = 3.14159265358979323846;

const char *sl_schedule_name(sl_schedule_type type) {
    switch (type) {
    case SL_SCHED_CONSTANT: return "constant";
    case SL_SCHED_WARMUP_LR: return "WarmupLR";
    case SL_SCHED_WARMUP_DECAY_LR: return "WarmupDecayLR";
    case SL_SCHED_WARMUP_COSINE_LR: return "WarmupCosineLR";
    }
    return "?";
}

void sl_schedule_constant(sl_schedule *s, double optimizer_lr) {
    memset(s, 0, sizeof *s);
    s->type = SL_SCHED_CONSTANT;
    s->optimizer_lr = optimizer_lr;
    s->warmup_max_lr = optimizer_lr;
    s->warmup_num_steps = 1000;
    s->cos_min_ratio = 0.0001;
}

static int get_double(const cJSON *params, const char *key, double *out, const char *where) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(params, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return sl_errorf("%s: scheduler.params.%s must be a finite number", where, key);
    *out = v->valuedouble;
    return 0;
}

static int get_int64(const cJSON *params, const char *key, int64_t *out, int required, const char *where) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(params, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return sl_errorf("%s: scheduler.params.%s is required", where, key);
        return 0;
    }
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || !(fabs(d) < 9.0e15) || d != floor(d))
        return sl_errorf("%s: scheduler.params.%s must be an integer", where, key);
    *out = (int64_t)d;
    return 0;
}

int sl_schedule_parse(sl_schedule *s, const cJSON *block, double optimizer_lr, const char *where) {
    sl_schedule_constant(s, optimizer_lr);
    if (!block || cJSON_IsNull(block)) return 0;
    if (!cJSON_IsObject(block)) return sl_errorf("%s: \"scheduler\" must be an object", where);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(block, "type");
    if (!type || !cJSON_IsString(type))
        return sl_errorf("%s: scheduler.type must be a string (\"WarmupLR\", \"WarmupDecayLR\" or "
                         "\"WarmupCosineLR\")", where);
    const char *t = type->valuestring;
    if (strcmp(t, "WarmupLR") == 0) s->type = SL_SCHED_WARMUP_LR;
    else if (strcmp(t, "WarmupDecayLR") == 0) s->type = SL_SCHED_WARMUP_DECAY_LR, s->warmup_max_lr = 0.001;
    else if (strcmp(t, "WarmupCosineLR") == 0) s->type = SL_SCHED_WARMUP_COSINE_LR;
    else
        return sl_errorf("%s: scheduler.type \"%s\" is not supported (expected \"WarmupLR\", \"WarmupDecayLR\" "
                         "or \"WarmupCosineLR\")", where, t);

    const cJSON *params = cJSON_GetObjectItemCaseSensitive(block, "params");
    if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params))
        return sl_errorf("%s: scheduler.params must be an object", where);
    static const char *const warmup_keys[] = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                                              "warmup_type", "last_batch_iteration", NULL};
    static const char *const decay_keys[] = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                                             "total_num_steps", "last_batch_iteration", NULL};
    static const char *const cosine_keys[] = {"total_num_steps", "warmup_min_ratio", "warmup_num_steps",
                                              "cos_min_ratio", "warmup_type", "last_batch_iteration", NULL};
    const char *const *known = s->type == SL_SCHED_WARMUP_LR ? warmup_keys
                               : s->type == SL_SCHED_WARMUP_DECAY_LR ? decay_keys : cosine_keys;
    for (const cJSON *it = params ? params->child : NULL; it; it = it->next) {
        int ok = 0;
        for (int i = 0; known[i]; i++) ok |= strcmp(it->string, known[i]) == 0;
        if (ok) continue;
        size_t len = strlen(s->warning);
        if (len == 0) snprintf(s->warning, sizeof s->warning, "unknown %s params ignored: %s", t, it->string);
        else if (len < sizeof s->warning) snprintf(s->warning + len, sizeof s->warning - len, ", %s", it->string);
    }
    for (const cJSON *it = block->child; it; it = it->next)
        if (strcmp(it->string, "type") != 0 && strcmp(it->string, "params") != 0)
            return sl_errorf("%s: unexpected key scheduler.%s (scheduler settings go in scheduler.params)",
                             where, it->string);

    int needs_total = s->type != SL_SCHED_WARMUP_LR;
    if (get_double(params, "warmup_min_lr", &s->warmup_min_lr, where) ||
        get_double(params, "warmup_max_lr", &s->warmup_max_lr, where) ||
        get_int64(params, "warmup_num_steps", &s->warmup_num_steps, 0, where) ||
        get_int64(params, "total_num_steps", &s->total_num_steps, needs_total, where) ||
        get_double(params, "warmup_min_ratio", &s->warmup_min_ratio, where) ||
        get_double(params, "cos_min_ratio", &s->cos_min_ratio, where))
        return -1;
    int64_t last = -1;
    if (get_int64(params, "last_batch_iteration", &last, 0, where)) return -1;
    if (last != -1)
        return sl_errorf("%s: scheduler.params.last_batch_iteration must be -1 (resume restores it from the "
                         "checkpoint)", where);
    const cJSON *wt = params ? cJSON_GetObjectItemCaseSensitive(params, "warmup_type") : NULL;
    if (wt && !cJSON_IsNull(wt)) {
        if (!cJSON_IsString(wt)) return sl_errorf("%s: scheduler.params.warmup_type must be a string", where);
        if (strcmp(wt->valuestring, "log") == 0) s->warmup_type = SL_WARMUP_LOG;
        else if (strcmp(wt->valuestring, "linear") == 0) s->warmup_type = SL_WARMUP_LINEAR;
        else
            return sl_errorf("%s: scheduler.params.warmup_type \"%s\" is not supported (expected \"log\" or "
                             "\"linear\")", where, wt->valuestring);
    }
    if (s->warmup_num_steps < 1)
        return sl_errorf("%s: scheduler.params.warmup_num_steps must be a positive integer, got %lld", where,
                         (long long)s->warmup_num_steps);
    if (s->warmup_num_steps < 2) s->warmup_num_steps = 2;  // DeepSpeed: max(2, warmup_num_steps)
    if (needs_total && s->total_num_steps < 1)
        return sl_errorf("%s: scheduler.params.total_num_steps must be positive, got %lld", where,
                         (long long)s->total_num_steps);
    if (s->warmup_min_lr < 0 || s->warmup_max_lr < 0 || s->warmup_min_ratio < 0 || s->cos_min_ratio < 0)
        return sl_errorf("%s: scheduler learning rates and ratios must be >= 0", where);
    return 0;
}

void sl_schedule_warmup_linear(sl_schedule *s, sl_schedule_type type, double lr, int64_t warmup_steps,
                               int64_t total_steps) {
    sl_schedule_constant(s, lr);
    if (type == SL_SCHED_CONSTANT) return;
    s->type = type;
    s->warmup_type = SL_WARMUP_LINEAR;
    s->warmup_num_steps = warmup_steps < 2 ? 2 : warmup_steps;  // DeepSpeed: max(2, warmup_num_steps)
    if (type != SL_SCHED_WARMUP_LR) s->total_num_steps = total_steps;
    if (type == SL_SCHED_WARMUP_COSINE_LR) s->cos_min_ratio = 0.1;
}

cJSON *sl_schedule_warmup_linear_block(sl_schedule_type type, double lr, int64_t warmup_steps, int64_t total_steps) {
    if (type == SL_SCHED_CONSTANT) return NULL;
    cJSON *blk = cJSON_CreateObject();
    cJSON_AddStringToObject(blk, "type", sl_schedule_name(type));
    cJSON *p = cJSON_AddObjectToObject(blk, "params");
    if (type == SL_SCHED_WARMUP_COSINE_LR) {
        cJSON_AddNumberToObject(p, "total_num_steps", (double)total_steps);
        cJSON_AddNumberToObject(p, "warmup_num_steps", (double)warmup_steps);
        cJSON_AddNumberToObject(p, "cos_min_ratio", 0.1);
    } else {
        if (type == SL_SCHED_WARMUP_DECAY_LR) cJSON_AddNumberToObject(p, "total_num_steps", (double)total_steps);
        cJSON_AddNumberToObject(p, "warmup_min_lr", 0.0);
        cJSON_AddNumberToObject(p, "warmup_max_lr", lr);
        cJSON_AddNumberToObject(p, "warmup_num_steps", (double)warmup_steps);
    }
    cJSON_AddStringToObject(p, "warmup_type", "linear");
    return blk;
}

// DeepSpeed's warmup gamma in [0, 1) for last_batch_iteration < warmup_num_steps.
static double warmup_gamma(const sl_schedule *s, int64_t it) {
    if (s->warmup_type == SL_WARMUP_LOG) return (1.0 / log((double)s->warmup_num_steps)) * log((double)it + 1.0);
    return (double)it / (double)s->warmup_num_steps;
}

double sl_schedule_lr_at_iteration(const sl_schedule *s, int64_t it) {
    switch (s->type) {
    case SL_SCHED_CONSTANT:
        return s->optimizer_lr;
    case SL_SCHED_WARMUP_LR:
    case SL_SCHED_WARMUP_DECAY_LR: {
        if (it < 0) return s->warmup_min_lr;
        double gamma;
        if (it < s->warmup_num_steps) gamma = warmup_gamma(s, it);
        else if (s->type == SL_SCHED_WARMUP_LR) gamma = 1.0;
        else {
            double span = (double)s->total_num_steps - (double)s->warmup_num_steps;
            gamma = ((double)s->total_num_steps - (double)it) / (span > 1.0 ? span : 1.0);
            if (gamma < 0.0) gamma = 0.0;
        }
        return s->warmup_min_lr + (s->warmup_max_lr - s->warmup_min_lr) * gamma;
    }
    case SL_SCHED_WARMUP_COSINE_LR: {
        if (it < 0) return 0.0;
        double ratio;
        if (it < s->warmup_num_steps) {
            ratio = s->warmup_min_ratio + warmup_gamma(s, it) * (1.0 - s->warmup_min_ratio);
        } else {
            double real_last = (double)it - (double)s->warmup_num_steps + 1.0;
            double total = (double)s->total_num_steps - (double)s->warmup_num_steps;
            double progress = real_last / (total > 1.0 ? total : 1.0);
            if (progress > 1.0) progress = 1.0;
            ratio = (1.0 + cos(PI * progress)) / 2.0;
            ratio = s->cos_min_ratio + (1.0 - s->cos_min_ratio) * ratio;
            if (ratio < 0.0) ratio = 0.0;
        }
        return s->optimizer_lr * ratio;
    }
    }
    return s->optimizer_lr;
}

double sl_schedule_lr(const sl_schedule *s, int64_t step) {
    return sl_schedule_lr_at_iteration(s, step > INT64_MIN ? step - 1 : INT64_MIN);
}
