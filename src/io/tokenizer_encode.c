// tokenizer_encode.c: text -> ids and ids -> text for every tokenizer the loaders build, following
// Hugging Face tokenizers' pipeline: added tokens are cut out of the text (leftmost, then longest);
// the rest is normalized, split into words by the pre-tokenizer's steps, and each word is turned into
// ids by byte-pair merging, lowest merge rank first and leftmost among equals (a rescan of a short
// word's pairs; a heap over a long word's, so a whole SentencePiece-style line costs n log n).
// Each encode call keeps its own word cache, scratch and PCRE2 match data: the tokenizer is read-only.
#include "io/tokenizer_internal.h"
#include "shardlm/error.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

typedef struct { int32_t *p; size_t n, cap; } id_buf;

static int id_push(id_buf *b, const int32_t *ids, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + n) cap *= 2;
        int32_t *p = realloc(b->p, cap * sizeof *p);
        if (!p) return sl_errorf("out of memory growing the token id buffer to %zu ids", cap);
        b->p = p; b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, ids, n * sizeof *ids);
    b->n += n;
    return 0;
}

// A growable byte buffer for normalized and rewritten text.
typedef struct { char *p; size_t n, cap; } byte_buf;

static int bytes_push(byte_buf *b, const char *p, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return sl_errorf("out of memory growing a text buffer to %zu bytes", cap);
        b->p = q; b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    return 0;
}

// One encode call's cache: word bytes -> the ids BPE made of them. Words repeat a lot in text, so
// most are looked up rather than merged.
typedef struct { uint64_t hash; size_t key_off; uint32_t key_len; size_t ids_off; uint32_t ids_len; } cache_entry;
typedef struct {
    cache_entry *slots;  // (cap) key_len == UINT32_MAX marks empty
    size_t cap, count;
    char *keys; size_t keys_n, keys_cap;
    id_buf ids;
} word_cache;

typedef struct { int32_t id; int prev, next; } symbol;                  // next == -1: the last
typedef struct { int32_t rank; int pos; int32_t a, b, m; } candidate;  // a merge of pos and its next

typedef struct {
    const sl_tokenizer *tok;
    id_buf out;
    id_buf scratch;  // the ids of the word just merged
    word_cache cache;
    symbol *sym; size_t sym_cap;
    candidate *heap; size_t heap_n, heap_cap;
    pcre2_match_data *md;
    byte_buf norm;   // the normalized text of the piece being encoded
} encoder;

static int cache_grow(word_cache *c) {
    size_t cap = c->cap ? c->cap * 2 : 4096;
    cache_entry *s = sl_malloc(cap * sizeof *s, "word cache");
    if (!s) return -1;
    for (size_t i = 0; i < cap; i++) s[i].key_len = UINT32_MAX;
    for (size_t i = 0; i < c->cap; i++) {
        if (c->slots[i].key_len == UINT32_MAX) continue;
        size_t j = c->slots[i].hash & (cap - 1);
        while (s[j].key_len != UINT32_MAX) j = (j + 1) & (cap - 1);
        s[j] = c->slots[i];
    }
    free(c->slots);
    c->slots = s; c->cap = cap;
    return 0;
}

// ---------------------------------------------------------------- byte-pair merging

static int cand_less(const candidate *x, const candidate *y) {
    return x->rank != y->rank ? x->rank < y->rank : x->pos < y->pos;
}

static int heap_push(encoder *e, candidate c) {
    if (e->heap_n == e->heap_cap) {
        size_t cap = e->heap_cap ? e->heap_cap * 2 : 256;
        candidate *h = realloc(e->heap, cap * sizeof *h);
        if (!h) return sl_errorf("out of memory growing the merge queue to %zu entries", cap);
        e->heap = h; e->heap_cap = cap;
    }
    size_t i = e->heap_n++;
    while (i > 0 && cand_less(&c, &e->heap[(i - 1) / 2])) {
        e->heap[i] = e->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    e->heap[i] = c;
    return 0;
}

static candidate heap_pop(encoder *e) {
    candidate top = e->heap[0], last = e->heap[--e->heap_n];
    size_t i = 0, n = e->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && cand_less(&e->heap[c + 1], &e->heap[c])) c++;
        if (!cand_less(&e->heap[c], &last)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n) e->heap[i] = last;
    return top;
}

// Queues the merge of symbol pos with its next, if the pair is a merge.
static int queue_pair(encoder *e, int pos) {
    const sl_tokenizer *t = e->tok;
    int nx = pos < 0 ? -1 : e->sym[pos].next;
    if (nx < 0) return 0;
    uint64_t key = (uint64_t)(uint32_t)e->sym[pos].id << 32 | (uint32_t)e->sym[nx].id;
    size_t slot = tok_merge_slot(t, key);
    if (t->merge_keys[slot] != key) return 0;
    return heap_push(e, (candidate){t->merge_rank[slot], pos, e->sym[pos].id, e->sym[nx].id, t->merge_id[slot]});
}

static int sym_push(encoder *e, size_t *n, int32_t id) {
    if (*n == e->sym_cap) {
        size_t cap = e->sym_cap ? e->sym_cap * 2 : 256;
        symbol *s = realloc(e->sym, cap * sizeof *s);
        if (!s) return sl_errorf("out of memory growing a word's symbols to %zu", cap);
        e->sym = s; e->sym_cap = cap;
    }
    e->sym[*n] = (symbol){id, (int)*n - 1, -1};
    if (*n) e->sym[*n - 1].next = (int)*n;
    (*n)++;
    return 0;
}

// The UTF-8 character at p: its length (1 for a byte that is not UTF-8, then *cp = -1).
static size_t next_char(const char *p, size_t n, utf8proc_int32_t *cp) {
    utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)p, (utf8proc_ssize_t)n, cp);
    if (l > 0) return (size_t)l;
    *cp = -1;
    return 1;
}

// The word's first symbols: its bytes (byte-level), or its characters, each the vocab's token, else
// its bytes' <0xXX> tokens (byte_fallback), else the unknown token (consecutive ones fused with
// fuse_unk; dropped when there is none, as tokenizers does).
static int word_symbols(encoder *e, const char *p, size_t n, size_t *count) {
    const sl_tokenizer *t = e->tok;
    *count = 0;
    if (t->kind == TOK_BYTE_LEVEL) {
        for (size_t i = 0; i < n; i++)
            if (sym_push(e, count, t->byte_id[(unsigned char)p[i]])) return -1;
        return 0;
    }
    int pending_unk = 0;  // tokenizers holds an unknown back until a vocab character (or the end) comes,
                          // fusing later ones into it, while byte-fallback tokens go out at once
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        size_t cl = next_char(p + i, n - i, &cp);
        int id = tok_vocab_find(t, p + i, cl);
        int fallback = id < 0 && t->byte_fallback;
        for (size_t k = 0; fallback && k < cl; k++) fallback = t->byte_id[(unsigned char)p[i + k]] >= 0;
        if (id >= 0) {
            if (pending_unk && sym_push(e, count, t->unk_id)) return -1;
            pending_unk = 0;
            if (sym_push(e, count, id)) return -1;
        } else if (fallback) {
            for (size_t k = 0; k < cl; k++)
                if (sym_push(e, count, t->byte_id[(unsigned char)p[i + k]])) return -1;
        } else if (t->unk_id >= 0) {
            if (pending_unk && !t->fuse_unk && sym_push(e, count, t->unk_id)) return -1;
            pending_unk = 1;
        }
        i += cl;
    }
    if (pending_unk && sym_push(e, count, t->unk_id)) return -1;
    return 0;
}

// A short word (most of them) is merged by rescanning its pairs after each merge, which looks up
// fewer distinct pairs than the heap; the same merges in the same order: each time the leftmost pair
// of the lowest rank (a merge may make a pair of lower rank than the next occurrence of its own:
// merges converted from SentencePiece do).
enum { SHORT_WORD = 48 };
static int merge_short(encoder *e, size_t len) {
    const sl_tokenizer *t = e->tok;
    int32_t s[SHORT_WORD];
    for (size_t i = 0; i < len; i++) s[i] = e->sym[i].id;
    while (len > 1) {
        int32_t best_rank = INT32_MAX, best_id = -1;
        size_t at = 0;
        for (size_t i = 0; i + 1 < len; i++) {
            uint64_t key = (uint64_t)(uint32_t)s[i] << 32 | (uint32_t)s[i + 1];
            size_t slot = tok_merge_slot(t, key);
            if (t->merge_keys[slot] == key && t->merge_rank[slot] < best_rank) {
                best_rank = t->merge_rank[slot]; best_id = t->merge_id[slot]; at = i;
            }
        }
        if (best_id < 0) break;
        s[at] = best_id;
        memmove(s + at + 1, s + at + 2, (len - at - 2) * sizeof *s);
        len--;
    }
    return id_push(&e->scratch, s, len);
}

// Byte-pair merging of one word into e->scratch.
static int bpe_word(encoder *e, const char *p, size_t n) {
    const sl_tokenizer *t = e->tok;
    e->scratch.n = 0;
    if (t->ignore_merges) {  // a word the vocab holds whole is that token (LLaMA 3)
        int32_t id = tok_vocab_find(t, p, n);
        if (id >= 0) return id_push(&e->scratch, &id, 1);
    }
    size_t count;
    if (word_symbols(e, p, n, &count)) return -1;
    if (count <= SHORT_WORD) return merge_short(e, count);
    e->heap_n = 0;
    for (size_t i = 0; i + 1 < count; i++)
        if (queue_pair(e, (int)i)) return -1;
    while (e->heap_n) {
        candidate c = heap_pop(e);
        symbol *s = &e->sym[c.pos];
        if (s->id != c.a || s->next < 0 || e->sym[s->next].id != c.b) continue;  // stale
        symbol *r = &e->sym[s->next];
        s->id = c.m;
        s->next = r->next;
        if (r->next >= 0) e->sym[r->next].prev = c.pos;
        r->id = -1;  // gone: never the left of a live pair again
        if (queue_pair(e, s->prev) || queue_pair(e, c.pos)) return -1;
    }
    for (int i = count ? 0 : -1; i >= 0; i = e->sym[i].next)
        if (id_push(&e->scratch, &e->sym[i].id, 1)) return -1;
    return 0;
}

static int encode_word(encoder *e, const char *p, size_t n) {
    if (n == 0) return 0;
    word_cache *c = &e->cache;
    if ((c->count + 1) * 2 > c->cap && cache_grow(c)) return -1;
    uint64_t h = tok_hash_bytes(p, n);
    size_t j = h & (c->cap - 1);
    for (;; j = (j + 1) & (c->cap - 1)) {
        cache_entry *ce = &c->slots[j];
        if (ce->key_len == UINT32_MAX) break;
        if (ce->hash == h && ce->key_len == n && memcmp(c->keys + ce->key_off, p, n) == 0)
            return id_push(&e->out, c->ids.p + ce->ids_off, ce->ids_len);
    }
    if (bpe_word(e, p, n)) return -1;
    if (c->keys_n + n > c->keys_cap) {
        size_t cap = c->keys_cap ? c->keys_cap : 65536;
        while (cap < c->keys_n + n) cap *= 2;
        char *k = realloc(c->keys, cap);
        if (!k) return sl_errorf("out of memory growing the word cache to %zu bytes", cap);
        c->keys = k; c->keys_cap = cap;
    }
    memcpy(c->keys + c->keys_n, p, n);
    c->slots[j] = (cache_entry){h, c->keys_n, (uint32_t)n, c->ids.n, (uint32_t)e->scratch.n};
    c->keys_n += n;
    c->count++;
    if (id_push(&c->ids, e->scratch.p, e->scratch.n)) return -1;
    return id_push(&e->out, e->scratch.p, e->scratch.n);
}

// ---------------------------------------------------------------- pre-tokenizer

typedef struct { size_t s, e; int match; } span;
typedef struct { span *p; size_t n, cap; } span_buf;

static int span_push(span_buf *b, size_t s, size_t e, int match) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        span *q = realloc(b->p, cap * sizeof *q);
        if (!q) return sl_errorf("out of memory splitting text into %zu pieces", cap);
        b->p = q; b->cap = cap;
    }
    b->p[b->n++] = (span){s, e, match};
    return 0;
}

// The matches of re in text and the gaps between them, in order, tiling the text.
static int regex_spans(encoder *e, const pcre2_code *re, const char *text, size_t len, span_buf *out) {
    if (!e->md && !(e->md = pcre2_match_data_create(32, NULL))) return sl_errorf("out of memory creating PCRE2 match data");
    size_t off = 0, prev = 0;
    while (off <= len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)text, len, off, 0, e->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return sl_errorf("pre-tokenising at byte %zu: PCRE2 match error: %s", off, msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t s = ov[0], m = ov[1];
        if (m == s) {  // an empty match splits nothing: look again one character on
            if (s >= len) break;
            utf8proc_int32_t cp;
            off = s + next_char(text + s, len - s, &cp);
            continue;
        }
        if (s > prev && span_push(out, prev, s, 0)) return -1;
        if (span_push(out, s, m, 1)) return -1;
        prev = off = m;
    }
    return prev < len ? span_push(out, prev, len, 0) : 0;
}

// Digits: each numeric character a match (Rust's char::is_numeric: categories Nd, Nl, No).
static int digit_spans(const char *text, size_t len, span_buf *out) {
    size_t prev = 0;
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t cp;
        size_t cl = next_char(text + i, len - i, &cp);
        utf8proc_category_t c = cp < 0 ? UTF8PROC_CATEGORY_CN : utf8proc_category(cp);
        if (c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO) {
            if (i > prev && span_push(out, prev, i, 0)) return -1;
            if (span_push(out, i, i + cl, 1)) return -1;
            prev = i + cl;
        }
        i += cl;
    }
    return prev < len ? span_push(out, prev, len, 0) : 0;
}

// tokenizers' SplitDelimiterBehavior, applied to spans in place (matches flipped first with invert).
static void apply_behavior(span_buf *b, int behavior, int invert) {
    if (invert)
        for (size_t i = 0; i < b->n; i++) b->p[i].match = !b->p[i].match;
    size_t w = 0;
    int prev_match = 0;
    switch (behavior) {
    case SPLIT_ISOLATED: return;
    case SPLIT_REMOVED:
        for (size_t i = 0; i < b->n; i++)
            if (!b->p[i].match) b->p[w++] = b->p[i];
        break;
    case SPLIT_MERGED_PREVIOUS:
        for (size_t i = 0; i < b->n; i++) {
            span s = b->p[i];
            if (s.match && !prev_match && w) b->p[w - 1].e = s.e;
            else b->p[w++] = s;
            prev_match = s.match;
        }
        break;
    case SPLIT_MERGED_NEXT: {  // from the end: a delimiter joins the piece after it
        size_t r = b->n;
        for (size_t i = b->n; i-- > 0;) {
            span s = b->p[i];
            if (s.match && !prev_match && r < b->n) b->p[r].s = s.s;
            else b->p[--r] = s;
            prev_match = s.match;
        }
        memmove(b->p, b->p + r, (b->n - r) * sizeof *b->p);
        w = b->n - r;
        break;
    }
    case SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < b->n; i++) {
            span s = b->p[i];
            if (s.match == prev_match && w) b->p[w - 1].e = s.e;
            else b->p[w++] = s;
            prev_match = s.match;
        }
        break;
    }
    b->n = w;
}

static int pre_run(encoder *e, int step, const char *p, size_t n, int at0);

// Splits p into spans by one step's rule and runs the next step on each non-empty piece.
static int pre_split(encoder *e, int step, const char *p, size_t n, int at0, int behavior, int invert,
                     const pcre2_code *re) {
    span_buf b = {0};
    int rc = re ? regex_spans(e, re, p, n, &b) : digit_spans(p, n, &b);
    if (rc == 0) apply_behavior(&b, behavior, invert);
    for (size_t i = 0; i < b.n && rc == 0; i++)
        if (b.p[i].e > b.p[i].s) rc = pre_run(e, step + 1, p + b.p[i].s, b.p[i].e - b.p[i].s, at0 && b.p[i].s == 0);
    free(b.p);
    return rc;
}

// Metaspace: spaces become the replacement, which is prepended per the scheme, then (split) each
// replacement starts a new word.
static int pre_metaspace(encoder *e, int step, const tok_pre *m, const char *p, size_t n, int at0) {
    size_t rn = (size_t)m->repl_n;
    int starts = n > 0 && p[0] == ' ';  // after the replacement the text starts with it
    if (!starts && n >= rn) starts = memcmp(p, m->repl, rn) == 0;
    int prepend = !starts && (m->prepend == PREPEND_ALWAYS || (m->prepend == PREPEND_FIRST && at0));
    byte_buf b = {0};
    int rc = prepend ? bytes_push(&b, m->repl, rn) : 0;
    for (size_t i = 0; i < n && rc == 0; i++) rc = p[i] == ' ' ? bytes_push(&b, m->repl, rn) : bytes_push(&b, p + i, 1);
    if (rc == 0 && !m->split) rc = pre_run(e, step + 1, b.p, b.n, at0);
    else if (rc == 0) {
        span_buf s = {0};
        size_t prev = 0;
        for (size_t i = 0; i + rn <= b.n && rc == 0; i++) {
            if (memcmp(b.p + i, m->repl, rn) != 0) continue;
            if (i > prev) rc = span_push(&s, prev, i, 0);
            if (rc == 0) rc = span_push(&s, i, i + rn, 1);
            prev = i + rn;
            i = prev - 1;
        }
        if (rc == 0 && prev < b.n) rc = span_push(&s, prev, b.n, 0);
        if (rc == 0) apply_behavior(&s, SPLIT_MERGED_NEXT, 0);
        for (size_t i = 0; i < s.n && rc == 0; i++)
            if (s.p[i].e > s.p[i].s) rc = pre_run(e, step + 1, b.p + s.p[i].s, s.p[i].e - s.p[i].s, at0 && s.p[i].s == 0);
        free(s.p);
    }
    free(b.p);
    return rc;
}

static int pre_run(encoder *e, int step, const char *p, size_t n, int at0) {
    const sl_tokenizer *t = e->tok;
    if (step == t->n_pre) return encode_word(e, p, n);
    const tok_pre *s = &t->pre[step];
    switch (s->kind) {
    case PRE_SPLIT: return pre_split(e, step, p, n, at0, s->behavior, s->invert, s->re);
    case PRE_DIGITS:
        return pre_split(e, step, p, n, at0, s->individual ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS, 0, NULL);
    case PRE_METASPACE: return pre_metaspace(e, step, s, p, n, at0);
    default: break;
    }
    byte_buf b = {0};  // ByteLevel: a space first (add_prefix_space), then GPT-2's regex (use_regex)
    if (s->add_prefix_space && (n == 0 || p[0] != ' ')) {
        if (bytes_push(&b, " ", 1) || bytes_push(&b, p, n)) { free(b.p); return -1; }
        p = b.p;
        n = b.n;
    }
    int rc = s->re ? pre_split(e, step, p, n, at0, SPLIT_ISOLATED, 0, s->re) : pre_run(e, step + 1, p, n, at0);
    free(b.p);
    return rc;
}

// ---------------------------------------------------------------- normalizer and added tokens

// Unicode normalization (utf8proc) of each run of valid UTF-8; a byte that is not UTF-8 stays as it is
// (Hugging Face never sees one: Python strings are Unicode).
static int unicode_normalize(int options, const char *p, size_t n, byte_buf *out) {
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n) {
            utf8proc_int32_t cp;
            size_t cl = next_char(p + j, n - j, &cp);
            if (cp < 0) break;
            j += cl;
        }
        if (j > i) {
            utf8proc_uint8_t *dst = NULL;
            utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)p + i, (utf8proc_ssize_t)(j - i), &dst,
                                              (utf8proc_option_t)options);
            int rc = m < 0 ? sl_errorf("normalizing text at byte %zu: %s", i, utf8proc_errmsg(m))
                           : bytes_push(out, (const char *)dst, (size_t)m);
            free(dst);
            if (rc) return -1;
        }
        if (j < n && bytes_push(out, p + j, 1)) return -1;  // the byte that is not UTF-8
        i = j < n ? j + 1 : n;
    }
    return 0;
}

static int normalize_into(const sl_tokenizer *t, const char *p, size_t n, byte_buf *out) {
    out->n = 0;
    if (bytes_push(out, p, n)) return -1;
    byte_buf tmp = {0};
    int rc = 0;
    for (int k = 0; k < t->n_norm && rc == 0; k++) {
        const tok_norm *s = &t->norm[k];
        tmp.n = 0;
        if (s->kind == NORM_PREPEND) {
            if (out->n == 0) continue;  // an empty text stays empty
            rc = bytes_push(&tmp, s->to, s->to_n) || bytes_push(&tmp, out->p, out->n) ? -1 : 0;
        } else if (s->kind == NORM_UNICODE) {
            rc = unicode_normalize(s->unicode, out->p, out->n, &tmp);
        } else {
            for (size_t i = 0; i < out->n && rc == 0;) {
                if (s->from_n && i + s->from_n <= out->n && memcmp(out->p + i, s->from, s->from_n) == 0) {
                    rc = bytes_push(&tmp, s->to, s->to_n);
                    i += s->from_n;
                } else {
                    rc = bytes_push(&tmp, out->p + i, 1);
                    i++;
                }
            }
        }
        byte_buf x = *out; *out = tmp; tmp = x;
    }
    free(tmp.p);
    return rc;
}

int tok_normalize(const sl_tokenizer *t, const char *p, size_t n, char **out, size_t *out_n) {
    byte_buf b = {0};
    if (normalize_into(t, p, n, &b) || bytes_push(&b, "", 0)) { free(b.p); return -1; }
    b.p[b.n] = '\0';
    *out = b.p;
    *out_n = b.n;
    return 0;
}

// Rust's char::is_whitespace, on the UTF-8 character at p (length in *cl).
static int is_space_at(const char *p, size_t n, size_t *cl) {
    utf8proc_int32_t cp;
    *cl = next_char(p, n, &cp);
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

static size_t space_before(const char *p, size_t from, size_t at) {  // whitespace ending at `at`, not before `from`
    size_t s = at;
    while (s > from) {
        size_t b = s - 1, cl;
        while (b > from && ((unsigned char)p[b] & 0xC0) == 0x80) b--;
        if (!is_space_at(p + b, s - b, &cl) || b + cl != s) break;
        s = b;
    }
    return s;
}

static size_t space_after(const char *p, size_t at, size_t len) {
    size_t e = at, cl;
    while (e < len && is_space_at(p + e, len - e, &cl)) e += cl;
    return e;
}

// The leftmost added token of the stage (0: matched in the raw text, 1: `normalized` ones, matched in
// the normalized text) in p[from, len), the longest at that place; -1 if none. *s, *e: the text it takes
// (with lstrip / rstrip's whitespace, not before `floor`).
static int find_added(const sl_tokenizer *t, const char *p, size_t floor, size_t from, size_t len, int stage,
                      size_t *s, size_t *e) {
    for (size_t i = from; i < len; i++) {
        if (!t->added_first[(unsigned char)p[i]]) continue;
        int best = -1;
        for (int k = 0; k < t->n_added; k++) {
            const tok_added *a = &t->added[k];
            if (a->normalized != stage || (unsigned char)a->content[0] != (unsigned char)p[i] || a->len > len - i)
                continue;
            if (memcmp(p + i, a->content, a->len) != 0) continue;
            if (best < 0 || a->len > t->added[best].len) best = k;
        }
        if (best < 0) continue;
        const tok_added *a = &t->added[best];
        *s = a->lstrip ? space_before(p, floor, i) : i;
        *e = a->rstrip ? space_after(p, i + a->len, len) : i + a->len;
        return best;
    }
    return -1;
}

typedef int (*segment_fn)(encoder *e, const char *p, size_t n, int at0, int with_special);

// Cuts the stage's added tokens out of p[0, n): each becomes its id, the text between goes to `rest`.
// Without with_special a special token's match stays in the text (tokenizers matches every added token
// and then leaves the special ones as text, so no other token is found inside one).
static int split_added(encoder *e, const char *p, size_t n, int at0, int with_special, int stage,
                       segment_fn rest) {
    size_t seg = 0, from = 0, s, end;
    int k;
    while ((k = find_added(e->tok, p, seg, from, n, stage, &s, &end)) >= 0) {
        from = end;
        if (e->tok->added[k].special && !with_special) continue;
        if (s > seg && rest(e, p + seg, s - seg, at0 && seg == 0, with_special)) return -1;
        if (id_push(&e->out, &e->tok->added[k].id, 1)) return -1;
        seg = end;
    }
    return seg < n ? rest(e, p + seg, n - seg, at0 && seg == 0, with_special) : 0;
}

static int pre_segment(encoder *e, const char *p, size_t n, int at0, int with_special) {
    (void)with_special;
    return pre_run(e, 0, p, n, at0);
}

// Text between raw-matched added tokens: normalized, then cut at the `normalized` ones.
static int encode_segment(encoder *e, const char *p, size_t n, int at0, int with_special) {
    if (n == 0) return 0;
    if (e->tok->n_norm == 0) return split_added(e, p, n, at0, with_special, 1, pre_segment);
    if (normalize_into(e->tok, p, n, &e->norm)) return -1;
    return split_added(e, e->norm.p, e->norm.n, at0, with_special, 1, pre_segment);
}

static int encode_impl(const sl_tokenizer *t, const char *text, size_t len, int with_special, int template,
                       int32_t **ids, size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    encoder e = {.tok = t};
    int rc = template ? id_push(&e.out, t->prefix, (size_t)t->n_prefix) : 0;
    if (rc == 0) rc = split_added(&e, text, len, 1, with_special, 0, encode_segment);
    if (rc == 0 && template) rc = id_push(&e.out, t->suffix, (size_t)t->n_suffix);
    free(e.scratch.p);
    free(e.cache.slots);
    free(e.cache.keys);
    free(e.cache.ids.p);
    free(e.sym);
    free(e.heap);
    free(e.norm.p);
    if (e.md) pcre2_match_data_free(e.md);
    if (rc == 0 && !e.out.p) {
        e.out.p = sl_malloc(sizeof(int32_t), "token ids");
        if (!e.out.p) rc = -1;
    }
    if (rc != 0) { free(e.out.p); return -1; }
    *ids = e.out.p;
    *n_ids = e.out.n;
    return 0;
}

int sl_tokenizer_encode(const sl_tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n_ids) {
    return encode_impl(t, text, len, 1, 0, ids, n_ids);
}

int sl_tokenizer_encode_ordinary(const sl_tokenizer *t, const char *text, size_t len, int32_t **ids,
                                 size_t *n_ids) {
    return encode_impl(t, text, len, 0, 0, ids, n_ids);
}

int sl_tokenizer_encode_special(const sl_tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n_ids) {
    return encode_impl(t, text, len, 1, 1, ids, n_ids);
}

int sl_tokenizer_template(const sl_tokenizer *t, const int32_t **prefix, int *n_prefix, const int32_t **suffix,
                          int *n_suffix) {
    if (prefix) *prefix = t->prefix;
    if (n_prefix) *n_prefix = t->n_prefix;
    if (suffix) *suffix = t->suffix;
    if (n_suffix) *n_suffix = t->n_suffix;
    return t->n_prefix + t->n_suffix;
}

// ---------------------------------------------------------------- decoding

const char *sl_tokenizer_token_bytes(const sl_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) { *len = 0; return NULL; }
    *len = t->dec_len[id];
    return t->dec_bytes[id];
}

// What the i-th of ids decodes to: the first token's own form under a Metaspace decoder.
static const char *decoded_at(const sl_tokenizer *t, const int32_t *ids, size_t i, size_t *len) {
    int first = i == 0 && t->first_len;
    *len = first ? t->first_len[ids[0]] : t->dec_len[ids[i]];
    return first ? t->first_bytes[ids[0]] : t->dec_bytes[ids[i]];
}

int sl_tokenizer_decode(const sl_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len) {
    *text = NULL;
    size_t total = 0, l;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return sl_errorf("decode: id %d at position %zu is outside the vocab [0, %d)", ids[i], i, t->n_vocab);
        decoded_at(t, ids, i, &l);
        total += l + (size_t)t->join_space;
    }
    char *out = sl_malloc(total + 1, "decoded text");
    if (!out) return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (i && t->join_space) out[o++] = ' ';
        const char *b = decoded_at(t, ids, i, &l);
        memcpy(out + o, b, l);
        o += l;
    }
    size_t skip = 0;  // the decoder's Strip / Metaspace: leading spaces of the whole text
    while (skip < (size_t)t->strip_left && skip < o && out[skip] == ' ') skip++;
    memmove(out, out + skip, o - skip);
    o -= skip;
    out[o] = '\0';
    *text = out;
    if (len) *len = o;
    return 0;
}
