// generate.c: prompt -> KV cache -> sampled tokens, streamed as decoded bytes.
#include "shardlm/generate.h"
#include "shardlm/error.h"
#include "shardlm/kv_cache.h"

int sl_generate(sl_model *m, const sl_tokenizer *tok, const int *prompt, int n_prompt,
                const sl_generate_config *cfg, int *out_ids, int *n_out, FILE *stream) {
    if (n_out) *n_out = 0;
    if (n_prompt < 1) return sl_errorf("generate: the prompt must hold at least one token");
    if (cfg->max_new_tokens < 0 || n_prompt > sl_config_context(&m->cfg) || cfg->max_new_tokens > sl_config_context(&m->cfg) - n_prompt)
        return sl_errorf("generate: prompt (%d tokens) + max_new_tokens (%d) exceeds the model's %d positions",
                         n_prompt, cfg->max_new_tokens, sl_config_context(&m->cfg));
    sl_kv_cache kv;
    if (sl_kv_cache_init(&kv, m, n_prompt + cfg->max_new_tokens)) return -1;
    sl_rng rng = sl_rng_make(cfg->seed, 0, 0, SL_RNG_SAMPLE);
    const float *logits = NULL;
    int rc = 0, eot = tok ? sl_tokenizer_eot_id(tok) : -1;
    rc = sl_model_forward_cached(m, &kv, prompt, n_prompt, &logits);  // the prompt as one prefill
    for (int i = 0; i < cfg->max_new_tokens && rc == 0; i++) {
        int next = sl_sample(logits, m->cfg.vocab_size, &cfg->sampler, &rng);
        if (next < 0) { rc = -1; break; }
        if (out_ids) out_ids[i] = next;
        if (n_out) *n_out = i + 1;
        int stop = next == eot;
        for (int k = 0; k < cfg->n_stop_ids; k++) stop |= next == cfg->stop_ids[k];
        if (cfg->stop_at_eot && stop) break;
        if (stream && tok) {
            size_t len;
            const char *bytes = sl_tokenizer_token_bytes(tok, next, &len);
            if (bytes) fwrite(bytes, 1, len, stream);
            fflush(stream);
        }
        if (i + 1 < cfg->max_new_tokens) rc = sl_kv_cache_forward(&kv, next, &logits);
    }
    sl_kv_cache_free(&kv);
    return rc;
}
