// lora.h: LoRA adapters on a model's linears, in PEFT's words. An adapted linear computes
//   y = x W^T + b + scale * B(A(dropout(x))),   scale = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora)
// (r and lora_alpha per module where PEFT's rank_pattern / alpha_pattern name it)
// with A (r, in) and B (out, r) trained and W, b frozen. shardlm fuses q/k/v into one GEMM and
// LLaMA's gate/up into another, so each PEFT module's adapter adds into a column range of its fused
// GEMM's output (sl_lora_adapter.col0, out_features).
//
// The adapters live in their own flat, layer-major buffer (params, grads) with their own offsets
// table naming every tensor as PEFT saves it: "base_model.model.<module path>.lora_A.weight" (r, in)
// and "...lora_B.weight" (out, r), and modules_to_save's copies "base_model.model.<module>.weight"
// (model/lora_saved.h). The table's units match the model's (unit 0: embeddings, 1 + l: block l,
// n_layer + 1: final norm and head), so unit 1 + l holds exactly block l's adapters (and its norms'
// copies).
//
// The model computes with them once attached (sl_model_attach_lora); attaching frees the model's
// gradient buffer: the base is frozen, its backward computes only the activations' gradients.
// The forward and backward reach unit u's adapters through its views (param_view[u], grad_view[u],
// weight_view[u]), which point into params / grads / weights_bf16 by default; a ZeRO engine points
// them at its windows instead (zero.h), exactly as it does the model's own views.
#ifndef SHARDLM_LORA_H
#define SHARDLM_LORA_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "shardlm/config.h"
#include "shardlm/layout.h"
#include "shardlm/ops.h"
#include "shardlm/precision.h"

#define SL_LORA_NAME_MAX 64
#define SL_LORA_TARGETS_MAX 32768  // bytes of the comma-joined target list (PEFT writes full paths)
#define SL_LORA_LAYERS_MAX 1024     // entries of layers_to_transform
#define SL_LORA_PATTERN_MAX 256     // bytes of layers_pattern (its names comma-joined)
#define SL_LORA_KEYS_MAX 1024       // entries of rank_pattern / alpha_pattern (PEFT's EVA writes one a module)
#define SL_LORA_TOKENS_MAX 4096     // entries of trainable_token_indices

// PEFT's rank_pattern / alpha_pattern: keys (regular expressions) in the file's order, each with a value.
// A module takes the value of the first key K for which re.match("(.*\.)?(K)$", path) succeeds (PEFT's
// get_pattern_key), the config's r / lora_alpha when none does.
typedef struct {
    int n;
    double value[SL_LORA_KEYS_MAX];
    char keys[SL_LORA_TARGETS_MAX];  // the n keys, each ended by '\n' (a key holding '\n' is refused)
} sl_lora_pattern_map;

// PEFT's bias: "none" (every base bias frozen), "all" (every bias of the model trained), "lora_only" (the
// biases of the adapted linears trained); trained biases are copies as modules_to_save's (lora_saved.h).
typedef enum { SL_LORA_BIAS_NONE = 0, SL_LORA_BIAS_ALL, SL_LORA_BIAS_LORA_ONLY } sl_lora_bias;

// PEFT's init_lora_weights: true (A as nn.Linear's reset, uniform in +-1/sqrt(in); B zero), "gaussian"
// (A normal with std 1/r; B zero), false (A and B both as nn.Linear's reset: B uniform in +-1/sqrt(r), so
// the adapted model does not start as the base).
typedef enum { SL_LORA_INIT_DEFAULT = 0, SL_LORA_INIT_GAUSSIAN, SL_LORA_INIT_NONE } sl_lora_init_mode;

// PEFT's LoraConfig, the part shardlm computes.
typedef struct {
    int r;                 // rank (> 0)
    double lora_alpha;     // scale numerator
    float lora_dropout;    // dropout probability on the adapter's input, in [0, 1)
    int use_rslora;        // scale = lora_alpha / sqrt(r)
    int all_linear;        // target_modules "all-linear": every linear of the blocks
    int target_regex;      // target_modules is a string other than "all-linear": PEFT's regular expression,
                           // held in target_modules, which a module matches when it matches its whole path
                           // (Python's re.fullmatch; PCRE2 here), e.g. ".*\.layers\.[0-3]\..*(q|v)_proj"
    int n_targets;         // target_modules as a list of names, comma-joined (a module matches a name it
    char target_modules[SL_LORA_TARGETS_MAX];  // equals or ends with after a '.'); PEFT writes full paths
    // layers_to_transform (with a list or "all-linear"; n_layers 0: every block): a module matched by a
    // name it ends with is adapted only in these blocks, the block's index read from its path as PEFT
    // does (the first "<layers_pattern>.<index>." with layers_pattern, which may begin the path, else
    // the first ".<name>.<index>."); a module named by its whole path is adapted wherever it is.
    int n_layers;
    int layers_to_transform[SL_LORA_LAYERS_MAX];
    char layers_pattern[SL_LORA_PATTERN_MAX];  // "" (any), or names comma-joined
    int layers_pattern_list;                   // layers_pattern was a JSON list (written back as one)
    // exclude_modules: modules never adapted although target_modules picks them; a list of names (a
    // module is excluded when its path equals one or ends with "." + one), or a string, a regular
    // expression its whole path matches (exclude_regex)
    int n_exclude, exclude_regex;
    char exclude_modules[SL_LORA_TARGETS_MAX];  // the names comma-joined, or the expression
    int use_dora;           // DoRA: a trained magnitude per output, the weight's row norms (model/lora_dora.h)
    int lora_bias;          // PEFT's lora_bias: lora_B carries a trained bias (out), added as scale * (B A x + b)
    int bias;               // sl_lora_bias
    // trainable_token_indices (PEFT's TrainableTokens): these rows of the embedding are trained, as whole
    // rows that replace the base's (lookup, and the head when it is the embedding); the list form, or
    // the object form's one key (token_module: a name the embedding's path ends with; "" for a list)
    int n_token_indices;
    int token_indices[SL_LORA_TOKENS_MAX];
    char token_module[SL_LORA_NAME_MAX];
    int init_lora_weights;  // how new adapters start (sl_lora_init_mode); adapters loaded from a file keep theirs
    // modules_to_save: modules trained whole next to the adapters, as PEFT's ModulesToSaveWrapper does: each
    // module whose path ends with one of the names (a plain string test, as PEFT's) gets a trained copy,
    // which the model uses in the module's place (embeddings, position embeddings, norms, the head)
    int n_modules_to_save;
    char modules_to_save[SL_LORA_TARGETS_MAX];  // the names comma-joined
    sl_lora_pattern_map rank_pattern;   // per-module ranks (positive integers)
    sl_lora_pattern_map alpha_pattern;  // per-module lora_alpha
} sl_lora_config;

// The fused GEMMs of a block an adapter can add to.
// SL_LINEAR_HEAD: the LM head (an untied lm_head, PEFT's target "lm_head"), as "block n_layer".
typedef enum { SL_LINEAR_QKV, SL_LINEAR_ATTN_OUT, SL_LINEAR_MLP_UP, SL_LINEAR_MLP_DOWN, SL_LINEAR_HEAD } sl_linear_kind;

typedef struct {
    int layer;
    sl_linear_kind linear;
    int col0, out_features, in_features;  // output columns [col0, col0 + out_features) of that GEMM
    int r;                                // its rank (rank_pattern's, else the config's r)
    float scale;                          // lora_alpha / r (alpha_pattern's alpha; / sqrt(r) with use_rslora)
    int lora_A, lora_B;                   // indices into the tensor table
    int lora_B_bias;                      // lora_B's bias (lora_bias), -1 without
    int magnitude;                        // DoRA's lora_magnitude_vector (out), -1 without DoRA
    char module[SL_LORA_NAME_MAX];        // its module path, e.g. "model.layers.0.self_attn.q_proj"
} sl_lora_adapter;

typedef struct sl_lora {
    sl_lora_config cfg;
    sl_model_config model_cfg;
    const sl_ops *ops;
    sl_tensor_info *tensors;   // PEFT names; shape (r, in) for A, (out, r) for B; hf_transposed 0
    int n_tensors;
    size_t total;              // floats in the flat buffer
    sl_lora_adapter *adapters; // in buffer order: block by block, each block's in the model's order
    int n_adapters;
    int *layer_first;          // n_layer + 2: block l's adapters are [layer_first[l], layer_first[l + 1]), the
                               // head's (layer n_layer) [layer_first[n_layer], layer_first[n_layer + 1])
    int n_units;               // the model's units (layout.h)
    size_t *unit_begin;        // n_units + 1 offsets into the flat buffer
    // the backend's buffers
    float *params, *grads;     // (total); grads NULL until sl_lora_alloc_grads (not needed to generate)
    size_t capacity;           // floats allocated for params and grads (>= total; ZeRO 1-2 pad them)
    sl_bf16 *weights_bf16;     // with ops->act_bf16: params rounded to bf16 (sl_lora_params_changed)
    float **param_view, **grad_view;  // (n_units) unit u's adapters: into params / grads, or a ZeRO window
    sl_bf16 **weight_view;            // (n_units) with ops->act_bf16: unit u's bf16 copy, as param_view
    // activations for up to act_N rows, planned by sl_lora_plan
    int act_N;
    void *act_memory;
    sl_act **u;                // per adapter (N, r): A's output, kept for backward
    sl_act **xd;               // per adapter (N, in): the dropped input (lora_dropout > 0 while training)
    sl_act *delta, *dh, *du;   // scratch (N, max out), (N, max in), (N, max r)
    // Dropout runs while `training` is set, with masks a pure function of (dropout_seed, adapter).
    int training;
    uint64_t dropout_seed;
    uint64_t version;          // counts sl_lora_params_changed: DoRA's norms are reused while it stands
    struct sl_dora *dora;      // DoRA's norms and buffers (use_dora), NULL until planned
    int *saved;                // modules_to_save (model/lora_saved.h): the copies' tensor indices (n_saved)
    int n_saved;
    int *saved_of;             // per tensor of the model's layout: the index of its copy, -1 (set when attached)
    int head_copy;             // the copy of a tied model's lm_head, -1 when none
    int saved_init_pending;    // fresh copies take the base's values when attached
    int saved_floor;           // the lowest block holding copies, -1 the embeddings (copies or trained tokens),
                               // n_layer none (set when attached)
    int saved_ln1_at_floor;    // the lowest block holding copies holds one of its ln_1 (set when attached)
    float *head_base;          // (vocab, C) host: the head's weight PEFT saved next to an lm_head adapter, which
                               // attaching checks against the base's head, then frees; NULL when none
    int tokens_delta;          // trainable_token_indices' rows (n, C), a tensor of unit 0; -1 when none
    int tokens_base;           // the embedding (a tensor of the model's layout), set when attached
    int *token_slot;           // (vocab) the row of tokens_delta a token id trains, -1 (set when attached)
    sl_act *tokens_weight;     // the embedding with those rows replaced, as the ops read it (set when attached)
    // LoRA on the embedding (model/lora_embed.h): lora_embedding_A (r, vocab) and lora_embedding_B (C, r),
    // tensors of unit 0, -1 when none; the module's path, rank and scale; activations for embed_N rows
    int embed_A, embed_B, embed_r;
    float embed_scale;
    char embed_module[SL_LORA_NAME_MAX];
    sl_act *embed_u, *embed_delta, *embed_du;  // (N, r), (N, C), (N, r)
    float *embed_rows;                         // (N, r) host: u gathered before it is stored
    float *embed_base;         // (vocab, C) host: the embedding PEFT saved next to its adapter (as head_base)
    int embed_N;
    int dora_init_pending;     // fresh adapters: their magnitudes are the base's norms, set when attached
    int backward_may_follow;   // set by the model before each forward: a backward may follow it (targets,
                               // not inference-only), so DoRA keeps what that backward reads
    char base_model[1024];     // the base's name or path, for adapter_config.json ("" = unknown)
} sl_lora;

// PEFT's defaults: r 8, lora_alpha 8, lora_dropout 0, no rslora, no targets (sl_lora_create then
// takes PEFT's default targets for the architecture: GPT-2 c_attn, LLaMA q_proj and v_proj).
void sl_lora_config_defaults(sl_lora_config *cfg);
// Reads a PEFT-style object (a train config's "lora" block or adapter_config.json): r, lora_alpha, use_dora,
// lora_dropout, target_modules (a list, "all-linear", or another string: a regular expression, checked
// to compile), use_rslora, bias, layers_to_transform / layers_pattern, exclude_modules,
// rank_pattern / alpha_pattern (each key checked to compile), modules_to_save, init_lora_weights. Other
// PEFT keys that change nothing here are accepted; a value shardlm cannot honour is an error naming
// `where` and the key.
int sl_lora_config_parse(sl_lora_config *cfg, const cJSON *obj, const char *where);
// target_modules as PEFT's regular expression (sl_lora_config.target_regex), compiled by PCRE2: NULL with
// the error (naming `where` and the pattern) when it does not compile; free with sl_lora_target_regex_free.
void *sl_lora_target_regex(const char *pattern, const char *where);
void sl_lora_target_regex_free(void *re);
// 1 when `path` (a module's name in the Hugging Face model, e.g. "model.layers.0.self_attn.q_proj")
// matches re as a whole (Python's re.fullmatch), 0 when not, -1 with the error on a matching failure.
int sl_lora_target_regex_matches(const void *re, const char *path);
// A rank_pattern / alpha_pattern's keys compiled for matching (NULL with the error naming `what` and the
// key when one does not compile; an empty map compiles to an empty set); free with sl_lora_keys_free.
void *sl_lora_keys_compile(const sl_lora_pattern_map *map, const char *what);
void sl_lora_keys_free(void *keys);
// The index of the first key from `from` on that matches `path` as PEFT's get_pattern_key matches
// (from 0: the key whose value the module takes), -1 when none, -2 with the error.
int sl_lora_keys_find(const void *keys, const char *path, int from);
// The block index PEFT's layers_to_transform reads from a module path (e.g. 0 for
// "model.layers.0.self_attn.q_proj"): by cfg's layers_pattern, or the first ".<name>.<index>."; -1 when
// it finds none, -2 with the error on a regex failure.
int sl_lora_layer_index(const sl_lora_config *cfg, const char *path);
// 1 when two rank_pattern / alpha_pattern maps hold the same keys in the same order with the same values.
int sl_lora_pattern_map_equal(const sl_lora_pattern_map *a, const sl_lora_pattern_map *b);
// init_lora_weights from "true", "false" or "gaussian" (any case); another value is an error naming `where`.
int sl_lora_init_parse(sl_lora_config *cfg, const char *value, const char *where);
// bias from "none", "all" or "lora_only"; another value is an error naming `where`.
int sl_lora_bias_parse(sl_lora_config *cfg, const char *value, const char *where);
// PEFT's word for a sl_lora_bias: "none", "all" or "lora_only".
const char *sl_lora_bias_name(int bias);
// trainable_token_indices from a comma-separated list of token ids ("50257,50258"): an error naming
// `where` for something else, a repeated id or too many.
int sl_lora_config_set_tokens(sl_lora_config *cfg, const char *list, const char *where);
// modules_to_save from a comma-separated list of names ("lm_head,wte").
int sl_lora_config_set_modules_to_save(sl_lora_config *cfg, const char *list, const char *where);
// One more modules_to_save name (an error naming `where` when empty, too long or holding a comma).
int sl_lora_config_add_module_to_save(sl_lora_config *cfg, const char *name, const char *where);
// target_modules from a comma-separated list ("q_proj,v_proj" or "all-linear").
int sl_lora_config_set_targets(sl_lora_config *cfg, const char *list, const char *where);
// Range checks: r > 0, lora_alpha finite, 0 <= lora_dropout < 1, rank_pattern's ranks > 0 and
// alpha_pattern's alphas finite.
int sl_lora_config_check(const sl_lora_config *cfg, const char *where);
// The config as adapter_config.json's fields (PEFT's LoraConfig keys) into obj.
int sl_lora_config_to_json(const sl_lora_config *cfg, cJSON *obj);

// Builds the adapters of cfg for a model of model_cfg on ops' backend and allocates their
// parameters (zero). An unknown target module (matching no linear of the model) is an error naming it.
// ops NULL: the tensor table and units only, no buffers (what a memory estimate needs).
int sl_lora_create(sl_lora *lora, const sl_model_config *model_cfg, const sl_lora_config *cfg, const sl_ops *ops);
void sl_lora_free(sl_lora *lora);
// The gradient buffer (zeroed), for training.
int sl_lora_alloc_grads(sl_lora *lora);
// Points every unit's views into params / grads / weights_bf16 (after they move).
void sl_lora_bind_views(sl_lora *lora);
void sl_lora_zero_grad(sl_lora *lora);
// PEFT's initialisation by cfg.init_lora_weights (sl_lora_init_mode; by default A as nn.Linear's reset,
// kaiming_uniform_(a=sqrt(5)): uniform in +-1/sqrt(in), and B zero), drawn from the counter-based RNG
// (seed, tensor index).
int sl_lora_init_weights(sl_lora *lora, uint64_t seed);
// For sl_model_attach_lora: DoRA's check (the CPU backend) and, for fresh adapters
// (sl_lora_init_weights), their magnitudes: the rows' norms of the base weights with the adapters'
// start added, as PEFT sets them; base_weights[a] is adapter a's fused base weight as the model hands
// its GEMM (plain, bf16 copy, or a quantised linear's placeholder). Nothing without use_dora.
int sl_lora_attached(sl_lora *lora, const sl_act *const *base_weights);
// Refreshes the bf16 copy after params changed (nothing without ops->act_bf16).
int sl_lora_params_changed(sl_lora *lora);
// Index of the tensor with this PEFT name, or -1.
int sl_lora_find(const sl_lora *lora, const char *name);
// "r=8" ("r=4..16" when rank_pattern gives the adapters several ranks), with ", scale 2" (or its range)
// when with_scale: into buf.
void sl_lora_describe(const sl_lora *lora, int with_scale, char *buf, size_t cap);
// The trained copies (modules_to_save's module paths "a, b, ...", then the count of biases `bias` trains
// and of trainable_token_indices' rows) into buf; returns their parameters (a vocabulary's padding rows
// not counted), 0 without any.
size_t sl_lora_saved_describe(const sl_lora *lora, char *buf, size_t cap);
// The module path of each adaptable linear of the block (for messages): "a, b, ..." into buf.
void sl_lora_list_modules(const sl_model_config *model_cfg, char *buf, size_t cap);

// PEFT saves an adapted lm_head's own weight with the adapters (lo->head_base, read by sl_peft_load) and
// loads it over the base's head: 0 when it is head (vocab x C host floats, the base's), equal or equal
// once rounded to bf16 / fp16 (a 16-bit base), else -1 with the error. 0 without one.
int sl_lora_check_head_base(const sl_lora *lora, const float *head);
// The same for the embedding PEFT saves next to a LoRA adapter on it (lo->embed_base; wte the base's).
int sl_lora_check_embed_base(const sl_lora *lora, const float *wte);
// lora_bias at attach: refused on a GPU backend (not yet run there); a warning naming the adapted
// linears whose base has no bias (training works, merging will not: PEFT warns alike). -1 with the error.
int sl_lora_bias_attach(const sl_lora *lora, const sl_param_layout *L);
// PEFT's merge_and_unload: W += (B @ A) * scale for every adapter (DoRA: then each row scaled by its
// magnitude over the row's norm), into the base's parameters
// `params` (host memory, layout L of the model the adapters were built for); the product in fp32
// by fused multiply-adds over r in order, then scaled and added, as torch's CPU GEMM computes
// delta_weight (bit for bit in tests/reference/check_lora_peft.py). The adapters' parameters are
// read through lora->ops->download. round16: the 16-bit rounding of the merged model's dtype
// (sl_round_to_bf16 / _fp16), NULL for fp32: an embedding adapter's delta is rounded to it before it is
// added, as PEFT's Embedding.merge adds get_delta_weight().to(base dtype) (its Linear adds fp32).
int sl_lora_merge(const sl_lora *lora, const sl_param_layout *L, float *params, float (*round16)(float));

// ---- what the model calls (model.c) ------------------------------------------------------------
// Plans activations for N rows (no-op when large enough).
int sl_lora_plan(sl_lora *lora, int N);
// Block `layer`'s first adapter on `linear` (the index into adapters), -1 when none.
int sl_lora_first_on(const sl_lora *lora, int layer, sl_linear_kind linear);
// y (N, ld) += scale * B(A(dropout(x))) in each of block `layer`'s adapters on `linear`; x (N, in). y
// holds the base GEMM's output, W and bias (NULL: none) are that GEMM's (DoRA rescales its columns).
void sl_lora_forward(sl_lora *lora, int layer, sl_linear_kind linear, const sl_act *x, sl_act *y, const sl_act *W,
                     const sl_act *bias, int N, int ld);
// The output gradient the base GEMM's backward takes: dy itself, or with DoRA adapters on the linear
// a copy with their columns rescaled (and their magnitudes' gradients taken). Called before that GEMM.
const sl_act *sl_lora_base_grad(sl_lora *lora, int layer, sl_linear_kind linear, const sl_act *dy, int N, int ld);
// 0 when a backward may follow the last forward, -1 with the error when it may not (DoRA keeps what its
// backward needs only when backward_may_follow was set for that forward).
int sl_lora_check_backward(const sl_lora *lora);
// 1 when block `layer`'s `linear` has DoRA adapters (its output gradient must be at hand unfused).
int sl_lora_dora_on(const sl_lora *lora, int layer, sl_linear_kind linear);
// Backward of sl_lora_forward with dy (N, ld) what sl_lora_base_grad returned: grads of A and B
// accumulate; dx (N, in), the input's gradient from the base GEMM, gets the adapters' part added
// (dx NULL: not wanted, the lowest block's input); W the GEMM's weight.
void sl_lora_backward(sl_lora *lora, int layer, sl_linear_kind linear, const sl_act *x, const sl_act *dy, sl_act *dx,
                      const sl_act *W, int N, int ld);

#endif
