// loader.c: the data loader of loader.h. Owns the sorted shard list with each shard's token and window
// counts, the current epoch's shard order and the window permutation of one shard (cached), and the
// one open shard file.
// Invariants: 0 <= batch < batches_per_epoch; order/cum describe epoch `epoch` (cum[k] = windows in
// the first k shards of the order); perm_shard is the shard whose window permutation is in perm
// (for epoch perm_epoch), or -1. Everything a batch contains is a function of (epoch, batch) and the
// configuration, never of the path taken to get there.
#include "shardlm/loader.h"
#include "shardlm/error.h"
#include "shardlm/json_get.h"
#include "shardlm/rng.h"
#include "shardlm/shard.h"

#include <cjson/cJSON.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct sl_loader {
    sl_loader_config cfg;
    char *pattern;             // owned copy of the pattern actually globbed
    int n_shards;
    char **paths;              // (n_shards) sorted
    int64_t *shard_tokens;     // (n_shards)
    int64_t *shard_windows;    // (n_shards)
    int64_t total_tokens, total_windows, batches_per_epoch;
    int64_t window_tokens;     // B*T (the stride); a window reads B*T+1
    int64_t epoch, batch;
    int32_t *order;            // (n_shards) shard order of this epoch
    int64_t *cum;              // (n_shards+1)
    int64_t perm_shard, perm_epoch;
    int64_t *perm;             // (max windows of a shard)
    sl_shard open;             // open.f == NULL when none
    int open_idx;
    int32_t *buf;              // (B*T+1)
};

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void fill_order(sl_loader *l) {
    for (int i = 0; i < l->n_shards; i++) l->order[i] = i;
    if (l->cfg.shuffle) {
        sl_rng r = sl_rng_make(l->cfg.seed, 0, (uint64_t)l->epoch, SL_RNG_DATA);
        for (int i = l->n_shards - 1; i > 0; i--) {
            int j = (int)sl_rng_below(&r, (uint64_t)i + 1);
            int32_t t = l->order[i]; l->order[i] = l->order[j]; l->order[j] = t;
        }
    }
    l->cum[0] = 0;
    for (int k = 0; k < l->n_shards; k++) l->cum[k + 1] = l->cum[k] + l->shard_windows[l->order[k]];
}

static void fill_perm(sl_loader *l, int shard) {
    int64_t n = l->shard_windows[shard];
    for (int64_t i = 0; i < n; i++) l->perm[i] = i;
    if (l->cfg.shuffle) {
        sl_rng r = sl_rng_make(l->cfg.seed, (uint64_t)shard + 1, (uint64_t)l->epoch, SL_RNG_DATA);
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = (int64_t)sl_rng_below(&r, (uint64_t)i + 1);
            int64_t t = l->perm[i]; l->perm[i] = l->perm[j]; l->perm[j] = t;
        }
    }
    l->perm_shard = shard;
    l->perm_epoch = l->epoch;
}

// The (shard, window) of global window g of the current epoch.
static void locate(sl_loader *l, int64_t g, int *shard, int64_t *window) {
    int lo = 0, hi = l->n_shards - 1;  // find k with cum[k] <= g < cum[k+1]
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (l->cum[mid] <= g) lo = mid; else hi = mid - 1;
    }
    int s = l->order[lo];
    if (l->perm_shard != s || l->perm_epoch != l->epoch) fill_perm(l, s);
    *shard = s;
    *window = l->perm[g - l->cum[lo]];
}

void sl_loader_close(sl_loader *l) {
    if (!l) return;
    if (l->open.f) sl_shard_close(&l->open);
    for (int i = 0; i < l->n_shards; i++) free(l->paths[i]);
    free(l->paths); free(l->shard_tokens); free(l->shard_windows);
    free(l->order); free(l->cum); free(l->perm); free(l->buf); free(l->pattern);
    free(l);
}

static int find_shards(sl_loader *l) {
    const char *p = l->cfg.pattern;
    char pat[4096];
    if (is_dir(p)) snprintf(pat, sizeof pat, "%s/%s%s.bin", p, l->cfg.split ? l->cfg.split : "", l->cfg.split ? "_*" : "*");
    else snprintf(pat, sizeof pat, "%s", p);
    l->pattern = strdup(pat);
    if (!l->pattern) return sl_errorf("out of memory");
    glob_t g;
    int rc = glob(pat, 0, NULL, &g);  // glob sorts the names
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
        if (rc == 0) globfree(&g);
        return sl_errorf("no token shards match %s", pat);
    }
    if (rc != 0) return sl_errorf("%s: cannot list token shards (glob error %d)", pat, rc);
    l->n_shards = (int)g.gl_pathc;
    l->paths = sl_calloc((size_t)l->n_shards, sizeof(char *), "shard paths");
    if (!l->paths) { globfree(&g); return -1; }
    for (int i = 0; i < l->n_shards; i++) {
        l->paths[i] = strdup(g.gl_pathv[i]);
        if (!l->paths[i]) { globfree(&g); return sl_errorf("out of memory"); }
    }
    globfree(&g);
    return 0;
}

int sl_loader_open(sl_loader **out, const sl_loader_config *cfg) {
    *out = NULL;
    if (!cfg->pattern) return sl_errorf("data loader: no shard pattern given");
    if (cfg->micro_batch <= 0 || cfg->seq_len <= 0)
        return sl_errorf("data loader: micro_batch and seq_len must be positive, got B=%d T=%d", cfg->micro_batch,
                         cfg->seq_len);
    if (cfg->world <= 0 || cfg->rank < 0 || cfg->rank >= cfg->world)
        return sl_errorf("data loader: rank %d is not in [0, world=%d)", cfg->rank, cfg->world);
    sl_loader *l = sl_calloc(1, sizeof *l, "data loader");
    if (!l) return -1;
    l->cfg = *cfg;
    l->perm_shard = -1;
    l->window_tokens = (int64_t)cfg->micro_batch * cfg->seq_len;
    if (find_shards(l) != 0) { sl_loader_close(l); return -1; }
    l->cfg.pattern = l->pattern;
    l->cfg.split = NULL;
    l->shard_tokens = sl_calloc((size_t)l->n_shards, sizeof(int64_t), "shard sizes");
    l->shard_windows = sl_calloc((size_t)l->n_shards, sizeof(int64_t), "shard windows");
    l->order = sl_calloc((size_t)l->n_shards, sizeof(int32_t), "shard order");
    l->cum = sl_calloc((size_t)l->n_shards + 1, sizeof(int64_t), "shard offsets");
    l->buf = sl_malloc(((size_t)l->window_tokens + 1) * sizeof(int32_t), "batch buffer");
    if (!l->shard_tokens || !l->shard_windows || !l->order || !l->cum || !l->buf) { sl_loader_close(l); return -1; }
    int64_t max_windows = 1;
    for (int i = 0; i < l->n_shards; i++) {
        sl_shard s;
        if (sl_shard_open(&s, l->paths[i]) != 0) { sl_loader_close(l); return -1; }
        l->shard_tokens[i] = s.n_tokens;
        l->shard_windows[i] = s.n_tokens > 0 ? (s.n_tokens - 1) / l->window_tokens : 0;
        sl_shard_close(&s);
        l->total_tokens += l->shard_tokens[i];
        l->total_windows += l->shard_windows[i];
        if (l->shard_windows[i] > max_windows) max_windows = l->shard_windows[i];
    }
    if (l->total_windows < cfg->world) {
        int rc = sl_errorf("%s: %d shard(s) hold %lld tokens, %lld window(s) of B*T+1 = %lld tokens within a shard; "
                           "need at least %d (one per rank): use fewer ranks, a smaller B or T, or more data",
                           l->pattern, l->n_shards, (long long)l->total_tokens, (long long)l->total_windows,
                           (long long)l->window_tokens + 1, cfg->world);
        sl_loader_close(l);
        return rc;
    }
    l->batches_per_epoch = l->total_windows / cfg->world;
    l->perm = sl_malloc((size_t)max_windows * sizeof(int64_t), "window permutation");
    if (!l->perm) { sl_loader_close(l); return -1; }
    l->open_idx = -1;
    fill_order(l);
    *out = l;
    return 0;
}

int sl_loader_next(sl_loader *l, int32_t *inputs, int32_t *targets) {
    int shard;
    int64_t window;
    locate(l, l->batch * l->cfg.world + l->cfg.rank, &shard, &window);
    if (l->open_idx != shard) {
        if (l->open.f) sl_shard_close(&l->open);
        l->open_idx = -1;
        if (sl_shard_open(&l->open, l->paths[shard]) != 0) return -1;
        if (l->open.n_tokens != l->shard_tokens[shard]) {
            int64_t now = l->open.n_tokens;
            sl_shard_close(&l->open);
            return sl_errorf("%s: shard changed since the loader opened it: %lld tokens, was %lld", l->paths[shard],
                             (long long)now, (long long)l->shard_tokens[shard]);
        }
        l->open_idx = shard;
    }
    size_t n = (size_t)l->window_tokens;
    if (sl_shard_read_tokens(&l->open, window * l->window_tokens, n + 1, l->cfg.vocab_size, l->buf) != 0) return -1;
    memcpy(inputs, l->buf, n * sizeof(int32_t));
    memcpy(targets, l->buf + 1, n * sizeof(int32_t));
    if (++l->batch == l->batches_per_epoch) {
        l->batch = 0;
        l->epoch++;
        fill_order(l);
    }
    return 0;
}

void sl_loader_reset(sl_loader *l) {
    l->epoch = 0;
    l->batch = 0;
    fill_order(l);
}

sl_loader_position sl_loader_tell(sl_loader *l) {
    sl_loader_position p = {l->epoch, l->batch, 0, 0};
    int shard;
    int64_t window;
    locate(l, l->batch * l->cfg.world + l->cfg.rank, &shard, &window);
    p.shard = shard;
    p.window = window;
    return p;
}

int sl_loader_seek(sl_loader *l, const sl_loader_position *pos) {
    if (pos->epoch < 0 || pos->batch < 0 || pos->batch >= l->batches_per_epoch)
        return sl_errorf("%s: cannot seek to epoch %lld batch %lld: expected epoch >= 0 and batch in [0, %lld)",
                         l->pattern, (long long)pos->epoch, (long long)pos->batch, (long long)l->batches_per_epoch);
    l->epoch = pos->epoch;
    l->batch = pos->batch;
    fill_order(l);
    return 0;
}

int sl_loader_position_to_json(const sl_loader_position *pos, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "{\"epoch\": %lld, \"batch\": %lld, \"shard\": %lld, \"window\": %lld}",
                     (long long)pos->epoch, (long long)pos->batch, (long long)pos->shard, (long long)pos->window);
    if (n < 0 || (size_t)n >= cap) return sl_errorf("loader position JSON needs %d bytes, buffer has %zu", n, cap);
    return 0;
}

int sl_loader_position_from_json(const char *json, sl_loader_position *pos) {
    cJSON *root = cJSON_Parse(json);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return sl_errorf("loader position: expected a JSON object, found \"%.60s\"", json);
    }
    const char *w = "loader position";
    pos->shard = pos->window = 0;
    int rc = sl_json_get_i64(root, "epoch", &pos->epoch, 1, 0, SL_JSON_INT_EXACT, w) ||
             sl_json_get_i64(root, "batch", &pos->batch, 1, 0, SL_JSON_INT_EXACT, w) ||
             sl_json_get_i64(root, "shard", &pos->shard, 0, 0, SL_JSON_INT_EXACT, w) ||
             sl_json_get_i64(root, "window", &pos->window, 0, 0, SL_JSON_INT_EXACT, w) ? -1 : 0;
    cJSON_Delete(root);
    return rc;
}

int64_t sl_loader_batches_per_epoch(const sl_loader *l) { return l->batches_per_epoch; }
int64_t sl_loader_num_tokens(const sl_loader *l) { return l->total_tokens; }
int sl_loader_num_shards(const sl_loader *l) { return l->n_shards; }
const char *sl_loader_shard_path(const sl_loader *l, int i) {
    return i >= 0 && i < l->n_shards ? l->paths[i] : NULL;
}
