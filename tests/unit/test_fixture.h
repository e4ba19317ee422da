// test_fixture.h: reading the reference fixtures (expected.safetensors files written by the scripts in
// tests/reference/) for the tests that compare against PyTorch: a Hugging Face model directory as a
// CPU model, a tensor as floats, a tensor's largest magnitude, and DIR/expected.safetensors with its
// batch (input_ids, targets stored as float32) as ints.
#ifndef SHARDLM_TEST_FIXTURE_H
#define SHARDLM_TEST_FIXTURE_H

#include "shardlm/error.h"
#include "shardlm/hf_weights.h"
#include "shardlm/lora.h"
#include "shardlm/model.h"
#include "shardlm/optim.h"
#include "shardlm/peft_adapter.h"
#include "shardlm/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

// The whole tensor `name` as floats (malloc'd; NULL with a line on stderr when absent or unreadable).
static inline float *fixture_tensor(const sl_st_file *f, const char *name, size_t *numel) {
    int idx = sl_st_find(f, name);
    if (idx < 0) { fprintf(stderr, "  fixture lacks %s\n", name); return NULL; }
    float *out = malloc(sizeof(float) * f->tensors[idx].numel);
    if (sl_st_read_f32(f, idx, out, f->tensors[idx].numel)) { fprintf(stderr, "  %s\n", sl_error()); free(out); return NULL; }
    if (numel) *numel = f->tensors[idx].numel;
    return out;
}

static inline double fixture_max_abs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

// input_ids and targets (B, T) as ints (malloc'd into *inputs, *targets); -1 when absent.
static inline int fixture_batch(const sl_st_file *f, int **inputs, int **targets, int *B, int *T) {
    size_t n = 0;
    float *ids = fixture_tensor(f, "input_ids", &n), *tg = fixture_tensor(f, "targets", NULL);
    if (!ids || !tg) { free(ids); free(tg); return -1; }
    int idx = sl_st_find(f, "input_ids");
    *B = (int)f->tensors[idx].shape[0];
    *T = (int)f->tensors[idx].shape[1];
    *inputs = malloc(sizeof(int) * n);
    *targets = malloc(sizeof(int) * n);
    for (size_t i = 0; i < n; i++) { (*inputs)[i] = (int)ids[i]; (*targets)[i] = (int)tg[i]; }
    free(ids);
    free(tg);
    return 0;
}

// The model in Hugging Face directory dir on the CPU table; -1 with the message on stderr.
static inline int fixture_model(const char *dir, sl_model *m, sl_model_config *cfg) {
    if (sl_hf_load_config(dir, cfg) || sl_model_create(m, cfg, &sl_ops_cpu) || sl_hf_load(dir, &m->layout, m->params)) {
        fprintf(stderr, "  %s\n", sl_error());
        return -1;
    }
    return 0;
}

// dir/expected.safetensors opened into *f and its batch read.
static inline int fixture_expected(const char *dir, sl_st_file *f, int **inputs, int **targets, int *B, int *T) {
    char path[512];
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    if (sl_st_open(f, path)) { fprintf(stderr, "  %s\n", sl_error()); return -1; }
    return fixture_batch(f, inputs, targets, B, T);
}

// Trains the adapters (params / grads, `total` floats) of m for `steps` AdamW steps as the reference
// scripts' torch.optim.AdamW (lr 1e-2, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on every adapter
// tensor) on one batch (the model's 16-bit copies refreshed after each step), and returns the largest
// relative distance of a step's loss from want[step]
// (INFINITY when a step fails). Prints the first and last step's losses.
static inline double fixture_adamw_track(sl_model *m, float *params, float *grads, size_t total, const int *inputs,
                                         const int *targets, int B, int T, const float *want, int steps,
                                         const char *name) {
    sl_optim_config oc;
    sl_optim_defaults(&oc);
    oc.lr = 1e-2;
    oc.beta1 = 0.9;
    oc.beta2 = 0.95;
    oc.eps = 1e-8;
    oc.weight_decay = 0.1;
    float *state[2] = {calloc(total, sizeof(float)), calloc(total, sizeof(float))};
    double worst = state[0] && state[1] ? 0 : INFINITY;
    for (int s = 0; s < steps && isfinite(worst); s++) {
        float loss;
        sl_model_zero_grad(m);
        if (sl_model_forward(m, inputs, targets, B, T, &loss) || sl_model_backward(m, 1.0f) ||
            sl_optim_step(&oc, oc.lr, s + 1, params, grads, state, NULL, 0, total) || sl_model_params_changed(m)) {
            fprintf(stderr, "  %s\n", sl_error());
            worst = INFINITY;
            break;
        }
        worst = fmax(worst, fabs(loss - want[s]) / fabs(want[s]));
        if (s == 0 || s == steps - 1) printf("  %s step %d: loss %.6f, reference %.6f\n", name, s + 1, loss, want[s]);
    }
    free(state[0]);
    free(state[1]);
    return worst;
}

// The PEFT adapter directory dir (written for a model of cfg) read into lora, with gradients, and attached
// to m on m's backend; -1 with the error on stderr.
static inline int fixture_attach_adapter(const char *dir, const sl_model_config *cfg, sl_model *m, sl_lora *lora) {
    if (sl_peft_load(dir, cfg, m->ops, lora) || sl_lora_alloc_grads(lora) || sl_model_attach_lora(m, lora)) {
        fprintf(stderr, "  %s\n", sl_error());
        return -1;
    }
    return 0;
}

#endif
