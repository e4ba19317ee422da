// bpe_train.c: learns a byte-level BPE vocabulary (GPT-2 style) from text and writes it as
// vocab.json + merges.txt. Owns the training state: distinct pre-token words with their counts, each
// word's current symbol sequence, a count per adjacent symbol pair with the list of words it occurs
// in, and a max-heap of (count, pair) candidates.
// Invariants: pair_count[p] always equals sum over words of (occurrences of p in the word) * word
// count; every pair with a positive count has at least one heap entry whose count is >= its current
// count (entries are pushed whenever a count grows; stale entries are fixed when popped); a pair's
// word list may hold words that no longer contain it (checked on use), never misses one that does.
// Ties go to the smaller (left, right) id pair, so training is deterministic.
#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// ---------------------------------------------------------------- a bytes -> index hash map

typedef struct {
    uint32_t *slots;  // index + 1, 0 = empty
    size_t cap, count;
    char *arena; size_t arena_n, arena_cap;
    size_t *off; uint32_t *len; size_t items_cap;  // per index: bytes in arena
} strmap;

static uint64_t hash_bytes(const char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) { h ^= (unsigned char)p[i]; h *= 0x100000001b3ULL; }
    return h ^ (h >> 29);
}

static void strmap_free(strmap *m) { free(m->slots); free(m->arena); free(m->off); free(m->len); }

static long strmap_find(const strmap *m, const char *p, size_t n, size_t *slot) {
    size_t mask = m->cap - 1, i = hash_bytes(p, n) & mask;
    for (;; i = (i + 1) & mask) {
        uint32_t s = m->slots[i];
        if (s == 0) { *slot = i; return -1; }
        if (m->len[s - 1] == n && memcmp(m->arena + m->off[s - 1], p, n) == 0) { *slot = i; return s - 1; }
    }
}

static int strmap_rehash(strmap *m) {
    size_t cap = m->cap ? m->cap * 2 : 1 << 14;
    uint32_t *slots = sl_calloc(cap, sizeof *slots, "BPE training hash map");
    if (!slots) return -1;
    for (size_t k = 0; k < m->count; k++) {
        size_t i = hash_bytes(m->arena + m->off[k], m->len[k]) & (cap - 1);
        while (slots[i]) i = (i + 1) & (cap - 1);
        slots[i] = (uint32_t)k + 1;
    }
    free(m->slots);
    m->slots = slots; m->cap = cap;
    return 0;
}

// Index of the bytes, inserting them if new (*added = 1). -1 on out of memory.
static long strmap_intern(strmap *m, const char *p, size_t n, int *added) {
    *added = 0;
    if ((m->count + 1) * 2 > m->cap && strmap_rehash(m)) return -1;
    size_t slot;
    long idx = strmap_find(m, p, n, &slot);
    if (idx >= 0) return idx;
    if (m->count == m->items_cap) {
        size_t cap = m->items_cap ? m->items_cap * 2 : 4096;
        size_t *off = realloc(m->off, cap * sizeof *off);
        if (off) m->off = off;
        uint32_t *len = realloc(m->len, cap * sizeof *len);
        if (len) m->len = len;
        if (!off || !len) return sl_errorf("out of memory growing the BPE training tables");
        m->items_cap = cap;
    }
    if (m->arena_n + n > m->arena_cap) {
        size_t cap = m->arena_cap ? m->arena_cap : 1 << 16;
        while (cap < m->arena_n + n) cap *= 2;
        char *a = realloc(m->arena, cap);
        if (!a) return sl_errorf("out of memory growing the BPE training arena");
        m->arena = a; m->arena_cap = cap;
    }
    memcpy(m->arena + m->arena_n, p, n);
    m->off[m->count] = m->arena_n;
    m->len[m->count] = (uint32_t)n;
    m->arena_n += n;
    m->slots[slot] = (uint32_t)m->count + 1;
    *added = 1;
    return (long)m->count++;
}

// ---------------------------------------------------------------- training state

typedef struct { int32_t *w; int32_t n, cap; } word_list;
typedef struct { int64_t count; uint64_t key; } heap_entry;

typedef struct {
    strmap words;         // distinct pre-token words
    int64_t *word_count;  // (n_words)
    size_t word_count_cap;
    int32_t *sym;         // symbols of all words, word w at sym[sym_off[w] .. + sym_len[w])
    size_t *sym_off;
    uint32_t *sym_len;
    // pairs: key (a << 32 | b) -> index, open addressing
    uint64_t *pair_slots_key; uint32_t *pair_slots_idx; size_t pair_cap;
    uint64_t *pair_key; int64_t *pair_count; word_list *pair_words; int32_t *pair_stamp;
    size_t n_pairs, pairs_cap;
    heap_entry *heap; size_t heap_n, heap_cap;
    strmap tokens;        // token bytes -> id
    int32_t *touched; size_t n_touched, touched_cap;
} trainer;

static uint64_t hash_u64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int count_word(void *ctx, const char *p, size_t n) {
    trainer *t = ctx;
    int added;
    long w = strmap_intern(&t->words, p, n, &added);
    if (w < 0) return -1;
    if (added && (size_t)w >= t->word_count_cap) {
        size_t cap = t->word_count_cap ? t->word_count_cap * 2 : 4096;
        int64_t *c = realloc(t->word_count, cap * sizeof *c);
        if (!c) return sl_errorf("out of memory counting words");
        t->word_count = c; t->word_count_cap = cap;
    }
    if (added) t->word_count[w] = 0;
    t->word_count[w]++;
    return 0;
}

static int pair_rehash(trainer *t) {
    size_t cap = t->pair_cap ? t->pair_cap * 2 : 1 << 16;
    uint64_t *keys = sl_malloc(cap * sizeof *keys, "pair map");
    uint32_t *idx = sl_malloc(cap * sizeof *idx, "pair map");
    if (!keys || !idx) { free(keys); free(idx); return -1; }
    memset(keys, 0xFF, cap * sizeof *keys);
    for (size_t p = 0; p < t->n_pairs; p++) {
        size_t i = hash_u64(t->pair_key[p]) & (cap - 1);
        while (keys[i] != UINT64_MAX) i = (i + 1) & (cap - 1);
        keys[i] = t->pair_key[p]; idx[i] = (uint32_t)p;
    }
    free(t->pair_slots_key); free(t->pair_slots_idx);
    t->pair_slots_key = keys; t->pair_slots_idx = idx; t->pair_cap = cap;
    return 0;
}

// Index of pair key, creating it (count 0, no words) if new; -1 on out of memory.
static long pair_get(trainer *t, uint64_t key) {
    if ((t->n_pairs + 1) * 2 > t->pair_cap && pair_rehash(t)) return -1;
    size_t mask = t->pair_cap - 1, i = hash_u64(key) & mask;
    while (t->pair_slots_key[i] != UINT64_MAX) {
        if (t->pair_slots_key[i] == key) return t->pair_slots_idx[i];
        i = (i + 1) & mask;
    }
    if (t->n_pairs == t->pairs_cap) {
        size_t cap = t->pairs_cap ? t->pairs_cap * 2 : 1 << 15;
        uint64_t *k = realloc(t->pair_key, cap * sizeof *k);
        if (k) t->pair_key = k;
        int64_t *c = realloc(t->pair_count, cap * sizeof *c);
        if (c) t->pair_count = c;
        word_list *w = realloc(t->pair_words, cap * sizeof *w);
        if (w) t->pair_words = w;
        int32_t *s = realloc(t->pair_stamp, cap * sizeof *s);
        if (s) t->pair_stamp = s;
        if (!k || !c || !w || !s) return sl_errorf("out of memory growing the pair table to %zu pairs", cap);
        t->pairs_cap = cap;
    }
    size_t p = t->n_pairs++;
    t->pair_key[p] = key;
    t->pair_count[p] = 0;
    t->pair_words[p] = (word_list){0};
    t->pair_stamp[p] = -1;
    t->pair_slots_key[i] = key;
    t->pair_slots_idx[i] = (uint32_t)p;
    return (long)p;
}

static int heap_better(const heap_entry *x, const heap_entry *y) {
    return x->count > y->count || (x->count == y->count && x->key < y->key);
}

static int heap_push(trainer *t, int64_t count, uint64_t key) {
    if (t->heap_n == t->heap_cap) {
        size_t cap = t->heap_cap ? t->heap_cap * 2 : 1 << 15;
        heap_entry *h = realloc(t->heap, cap * sizeof *h);
        if (!h) return sl_errorf("out of memory growing the pair heap");
        t->heap = h; t->heap_cap = cap;
    }
    size_t i = t->heap_n++;
    t->heap[i] = (heap_entry){count, key};
    while (i > 0 && heap_better(&t->heap[i], &t->heap[(i - 1) / 2])) {
        heap_entry tmp = t->heap[i]; t->heap[i] = t->heap[(i - 1) / 2]; t->heap[(i - 1) / 2] = tmp;
        i = (i - 1) / 2;
    }
    return 0;
}

static heap_entry heap_pop(trainer *t) {
    heap_entry top = t->heap[0];
    t->heap[0] = t->heap[--t->heap_n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, b = i;
        if (l < t->heap_n && heap_better(&t->heap[l], &t->heap[b])) b = l;
        if (r < t->heap_n && heap_better(&t->heap[r], &t->heap[b])) b = r;
        if (b == i) break;
        heap_entry tmp = t->heap[i]; t->heap[i] = t->heap[b]; t->heap[b] = tmp;
        i = b;
    }
    return top;
}

// Adds `sign * count(w)` to every adjacent pair of word w; on adding, records w in the pair's word
// list and marks the pair as touched in this merge round (stamp) so it gets a fresh heap entry.
static int word_pairs_update(trainer *t, int32_t w, int sign, int32_t stamp) {
    const int32_t *s = t->sym + t->sym_off[w];
    int64_t c = t->word_count[w] * sign;
    for (uint32_t i = 0; i + 1 < t->sym_len[w]; i++) {
        uint64_t key = (uint64_t)(uint32_t)s[i] << 32 | (uint32_t)s[i + 1];
        long p = pair_get(t, key);
        if (p < 0) return -1;
        t->pair_count[p] += c;
        if (sign < 0) continue;
        word_list *wl = &t->pair_words[p];
        if (wl->n == 0 || wl->w[wl->n - 1] != w) {
            if (wl->n == wl->cap) {
                int32_t cap = wl->cap ? wl->cap * 2 : 4;
                int32_t *a = realloc(wl->w, (size_t)cap * sizeof *a);
                if (!a) return sl_errorf("out of memory growing a pair's word list");
                wl->w = a; wl->cap = cap;
            }
            wl->w[wl->n++] = w;
        }
        if (t->pair_stamp[p] != stamp) {
            t->pair_stamp[p] = stamp;
            if (t->n_touched == t->touched_cap) {
                size_t cap = t->touched_cap ? t->touched_cap * 2 : 4096;
                int32_t *a = realloc(t->touched, cap * sizeof *a);
                if (!a) return sl_errorf("out of memory tracking touched pairs");
                t->touched = a; t->touched_cap = cap;
            }
            t->touched[t->n_touched++] = (int32_t)p;
        }
    }
    return 0;
}

static int word_has_pair(const trainer *t, int32_t w, int32_t a, int32_t b) {
    const int32_t *s = t->sym + t->sym_off[w];
    for (uint32_t i = 0; i + 1 < t->sym_len[w]; i++)
        if (s[i] == a && s[i + 1] == b) return 1;
    return 0;
}

static void word_merge(trainer *t, int32_t w, int32_t a, int32_t b, int32_t z) {
    int32_t *s = t->sym + t->sym_off[w];
    uint32_t n = t->sym_len[w], o = 0;
    for (uint32_t i = 0; i < n;) {
        if (i + 1 < n && s[i] == a && s[i + 1] == b) { s[o++] = z; i += 2; }
        else s[o++] = s[i++];
    }
    t->sym_len[w] = o;
}

// ---------------------------------------------------------------- output

// Appends token bytes as JSON-string-safe GPT-2 unicode (UTF-8 of bytes_to_unicode code points).
static size_t put_token(char *out, const char *p, size_t n, int json) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = sl_byte_to_unicode((uint8_t)p[i]);
        if (cp < 0x80) {
            if (json && (cp == '"' || cp == '\\')) out[o++] = '\\';
            out[o++] = (char)cp;
        } else {
            out[o++] = (char)(0xC0 | (cp >> 6));
            out[o++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    return o;
}

static int write_outputs(const trainer *t, const uint64_t *merges, size_t n_merges, const char *out_dir) {
    const strmap *tok = &t->tokens;
    size_t bytes = 64;
    for (size_t i = 0; i < tok->count; i++) bytes += 4 * (size_t)tok->len[i] + 32;
    char *vj = sl_malloc(bytes, "vocab.json text");
    size_t merge_bytes = 32;
    for (size_t i = 0; i < n_merges; i++)
        merge_bytes += 2 * ((size_t)tok->len[merges[i] >> 32] + tok->len[(uint32_t)merges[i]]) + 2;
    char *mt = sl_malloc(merge_bytes, "merges.txt text");
    if (!vj || !mt) { free(vj); free(mt); return -1; }
    size_t o = 0;
    vj[o++] = '{';
    for (size_t id = 0; id < tok->count; id++) {
        o += (size_t)sprintf(vj + o, "%s\"", id ? ", " : "");
        o += put_token(vj + o, tok->arena + tok->off[id], tok->len[id], 1);
        o += (size_t)sprintf(vj + o, "\": %zu", id);
    }
    o += (size_t)sprintf(vj + o, "%s\"%s\": %zu}\n", tok->count ? ", " : "", SL_EOT_STRING, tok->count);
    size_t mo = (size_t)sprintf(mt, "#version: 0.2\n");
    int rc = 0;
    for (size_t i = 0; i < n_merges; i++) {
        uint32_t a = (uint32_t)(merges[i] >> 32), b = (uint32_t)merges[i];
        mo += put_token(mt + mo, tok->arena + tok->off[a], tok->len[a], 0);
        mt[mo++] = ' ';
        mo += put_token(mt + mo, tok->arena + tok->off[b], tok->len[b], 0);
        mt[mo++] = '\n';
    }
    char path[4096];
    if (sl_mkdirs(out_dir) != 0) rc = -1;
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/vocab.json", out_dir);
        rc = sl_write_file_atomic(path, vj, o);
    }
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/merges.txt", out_dir);
        rc = sl_write_file_atomic(path, mt, mo);
    }
    free(vj);
    free(mt);
    return rc;
}

// ---------------------------------------------------------------- the training loop

static void trainer_free(trainer *t) {
    strmap_free(&t->words);
    strmap_free(&t->tokens);
    free(t->word_count); free(t->sym); free(t->sym_off); free(t->sym_len);
    free(t->pair_slots_key); free(t->pair_slots_idx); free(t->pair_key); free(t->pair_count);
    for (size_t p = 0; p < t->n_pairs; p++) free(t->pair_words[p].w);
    free(t->pair_words); free(t->pair_stamp); free(t->heap); free(t->touched);
}

static int train(trainer *t, const char *const *texts, const size_t *lens, size_t n_texts, int vocab_size,
                 const char *out_dir, int verbose) {
    double t0 = (double)clock() / CLOCKS_PER_SEC;
    for (size_t i = 0; i < n_texts; i++)
        if (sl_pretokenize(texts[i], lens[i], 1, count_word, NULL, t) != 0) return -1;
    size_t n_words = t->words.count, n_syms = t->words.arena_n;
    t->sym = sl_malloc(n_syms * sizeof *t->sym, "word symbols");
    t->sym_off = sl_malloc(n_words * sizeof *t->sym_off, "word symbol offsets");
    t->sym_len = sl_malloc(n_words * sizeof *t->sym_len, "word symbol lengths");
    if (!t->sym || !t->sym_off || !t->sym_len) return -1;
    for (size_t w = 0; w < n_words; w++) {
        t->sym_off[w] = t->words.off[w];
        t->sym_len[w] = t->words.len[w];
        for (uint32_t i = 0; i < t->words.len[w]; i++)
            t->sym[t->words.off[w] + i] = (unsigned char)t->words.arena[t->words.off[w] + i];
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        int added;
        if (strmap_intern(&t->tokens, &c, 1, &added) < 0) return -1;
    }
    for (size_t w = 0; w < n_words; w++)
        if (word_pairs_update(t, (int32_t)w, +1, 0) != 0) return -1;
    for (size_t i = 0; i < t->n_touched; i++) {
        int32_t p = t->touched[i];
        if (heap_push(t, t->pair_count[p], t->pair_key[p]) != 0) return -1;
    }
    if (verbose)
        fprintf(stderr, "bpe: %zu distinct words, %zu pairs; learning up to %d tokens\n", n_words, t->n_pairs,
                vocab_size);
    size_t want_merges_cap = (size_t)vocab_size;
    uint64_t *merges = sl_malloc(want_merges_cap * 2 * sizeof *merges, "merge list");
    if (!merges) return -1;
    size_t n_merges = 0;
    int32_t *work = NULL;
    size_t work_cap = 0;
    int rc = 0;
    char *buf = NULL;
    size_t buf_cap = 0;
    int32_t stamp = 1;
    while (rc == 0 && t->tokens.count < (size_t)vocab_size - 1 && t->heap_n > 0) {
        heap_entry top = heap_pop(t);
        long p = pair_get(t, top.key);
        if (p < 0) { rc = -1; break; }
        if (t->pair_count[p] != top.count) {  // stale: re-queue with the current count
            if (t->pair_count[p] > 0 && heap_push(t, t->pair_count[p], top.key) != 0) rc = -1;
            continue;
        }
        if (top.count < 2) break;
        int32_t a = (int32_t)(top.key >> 32), b = (int32_t)(uint32_t)top.key;
        size_t na = t->tokens.len[a], nb = t->tokens.len[b];
        if (na + nb > buf_cap) {
            buf_cap = 2 * (na + nb);
            char *nbuf = realloc(buf, buf_cap);
            if (!nbuf) { rc = sl_errorf("out of memory"); break; }
            buf = nbuf;
        }
        memcpy(buf, t->tokens.arena + t->tokens.off[a], na);
        memcpy(buf + na, t->tokens.arena + t->tokens.off[b], nb);
        int added;
        long z = strmap_intern(&t->tokens, buf, na + nb, &added);  // an existing string keeps its id
        if (z < 0) { rc = -1; break; }
        if (n_merges == want_merges_cap * 2) {
            uint64_t *m = realloc(merges, want_merges_cap * 4 * sizeof *m);
            if (!m) { rc = sl_errorf("out of memory"); break; }
            merges = m; want_merges_cap *= 2;
        }
        merges[n_merges++] = top.key;
        // Copy the word list: updating pairs may grow other lists, and this one must not change under us.
        word_list *wl = &t->pair_words[p];
        if ((size_t)wl->n > work_cap) {
            work_cap = (size_t)wl->n * 2;
            int32_t *nw = realloc(work, work_cap * sizeof *nw);
            if (!nw) { rc = sl_errorf("out of memory"); break; }
            work = nw;
        }
        int32_t nlist = wl->n;
        memcpy(work, wl->w, (size_t)nlist * sizeof *work);
        t->n_touched = 0;
        stamp++;
        for (int32_t k = 0; k < nlist && rc == 0; k++) {
            int32_t w = work[k];
            if (!word_has_pair(t, w, a, b)) continue;
            if (word_pairs_update(t, w, -1, stamp) != 0) { rc = -1; break; }
            word_merge(t, w, a, b, (int32_t)z);
            if (word_pairs_update(t, w, +1, stamp) != 0) rc = -1;
        }
        free(t->pair_words[p].w);  // the pair is gone from every word
        t->pair_words[p] = (word_list){0};
        for (size_t i = 0; i < t->n_touched && rc == 0; i++) {
            int32_t q = t->touched[i];
            if (t->pair_count[q] > 0) rc = heap_push(t, t->pair_count[q], t->pair_key[q]);
        }
        if (verbose && (n_merges % 1000 == 0))
            fprintf(stderr, "bpe: %zu merges, %zu tokens, last merge count %lld, %.1f s\n", n_merges,
                    t->tokens.count, (long long)top.count, (double)clock() / CLOCKS_PER_SEC - t0);
    }
    free(work);
    free(buf);
    if (rc == 0) rc = write_outputs(t, merges, n_merges, out_dir);
    if (rc == 0 && verbose)
        fprintf(stderr, "bpe: wrote %s/vocab.json (%zu tokens) and merges.txt (%zu merges) in %.1f s\n", out_dir,
                t->tokens.count + 1, n_merges, (double)clock() / CLOCKS_PER_SEC - t0);
    free(merges);
    return rc;
}

int sl_bpe_train(const char *const *texts, const size_t *lens, size_t n_texts, int vocab_size,
                 const char *out_dir, int verbose) {
    if (vocab_size < 257)
        return sl_errorf("BPE training: vocab size must be at least 257 (256 bytes + <|endoftext|>), got %d",
                         vocab_size);
    trainer t = {0};
    int rc = train(&t, texts, lens, n_texts, vocab_size, out_dir, verbose);
    trainer_free(&t);
    if (rc != 0) sl_error_context("training a %d-token BPE into %s", vocab_size, out_dir);
    return rc;
}
