// tokenizer_json.c: Hugging Face's tokenizer.json (the file `tokenizers` and transformers' fast
// tokenizers read) for BPE models: GPT-2, LLaMA 3, Qwen-style byte-level BPE and the SentencePiece BPE
// of LLaMA 2 / Mistral as transformers converts it (character symbols, byte_fallback, the "▁" space).
// What is read: model (BPE: vocab, merges as "A B" strings or [A, B] pairs, byte_fallback, unk_token,
// fuse_unk, ignore_merges), added_tokens, normalizer (NFC / NFD / NFKC / NFKD through utf8proc,
// Prepend, Replace with a string, Sequence),
// pre_tokenizer (ByteLevel, Split, Metaspace, Digits, Sequence), post_processor (TemplateProcessing's
// single template, ByteLevel, Sequence) and decoder (ByteLevel, Metaspace, Replace with a string,
// ByteFallback, Fuse, Strip of leading spaces, Sequence). Anything else is refused by name rather
// than encoded differently from Hugging Face. tokenizer_config.json, when given, names the bos / eos
// tokens.
#include "io/tokenizer_internal.h"
#include "shardlm/error.h"
#include "shardlm/json_get.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <utf8proc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    sl_tokenizer *t;
    const char *path;
    int has_byte_level;              // a ByteLevel pre-tokenizer or decoder: byte-level symbols
    int dec_byte_fallback;           // the decoder turns <0xXX> into the byte
    char *dec_from, *dec_to;         // the decoder's one Replace or Metaspace step (literal strings)
    int dec_fused;                   // a Fuse step came: a Strip after it strips the whole text
} loader;

static const char *type_of(const cJSON *o) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(ty) ? ty->valuestring : NULL;
}

static int bool_field(const loader *L, const cJSON *o, const char *key, int dflt, const char *where) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return dflt;
    if (!cJSON_IsBool(v)) return sl_errorf("%s: %s.%s: expected true or false", L->path, where, key), -1;
    return cJSON_IsTrue(v);
}

static const char *string_field(const loader *L, const cJSON *o, const char *key, const char *where) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsString(v)) return v->valuestring;
    sl_errorf("%s: %s.%s: expected a string", L->path, where, key);
    return NULL;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s);
    char *p = sl_malloc(n + 1, "tokenizer string");
    if (p) memcpy(p, s, n + 1);
    return p;
}

// A Split / Replace pattern: {"String": s} or {"Regex": r}. *is_regex tells which.
static const char *pattern_of(const loader *L, const cJSON *o, const char *where, int *is_regex) {
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(pat, "String");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    *is_regex = cJSON_IsString(r);
    if (cJSON_IsString(s)) return s->valuestring;
    if (cJSON_IsString(r)) return r->valuestring;
    sl_errorf("%s: %s.pattern: expected {\"String\": ...} or {\"Regex\": ...}", L->path, where);
    return NULL;
}

// A normalizer, pre-tokenizer, decoder or post-processor: null (none), one step, or a Sequence whose
// array `list` holds steps (Sequences again allowed); `step` reads one of `type` at `where`.
typedef int (*step_fn)(loader *L, const cJSON *o, const char *type, const char *where);
static int read_steps(loader *L, const cJSON *o, const char *list, const char *where, step_fn step) {
    if (!o || cJSON_IsNull(o)) return 0;
    const char *ty = type_of(o);
    if (!cJSON_IsObject(o) || !ty) return sl_errorf("%s: %s: expected an object with a \"type\"", L->path, where);
    if (strcmp(ty, "Sequence") != 0) return step(L, o, ty, where);
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(o, list);
    if (!cJSON_IsArray(items)) return sl_errorf("%s: %s.%s: expected an array", L->path, where, list);
    int i = 0;
    for (const cJSON *c = items->child; c; c = c->next, i++) {
        char w[160];  // a nesting too deep for it is named cut short
        if (snprintf(w, sizeof w, "%s.%s[%d]", where, list, i) >= (int)sizeof w) memcpy(w + sizeof w - 4, "...", 4);
        if (read_steps(L, c, list, w, step)) return -1;
    }
    return 0;
}

// ---------------------------------------------------------------- normalizer

static int add_norm(loader *L, int kind, const char *from, const char *to) {
    sl_tokenizer *t = L->t;
    tok_norm *n = realloc(t->norm, (size_t)(t->n_norm + 1) * sizeof *n);
    if (!n) return sl_errorf("out of memory reading the normalizer");
    t->norm = n;
    tok_norm *s = &t->norm[t->n_norm];
    *s = (tok_norm){.kind = kind};
    t->n_norm++;
    if ((from && !(s->from = dup_str(from))) || !(s->to = dup_str(to))) return -1;
    s->from_n = from ? strlen(from) : 0;
    s->to_n = strlen(to);
    return 0;
}

static int read_normalizer(loader *L, const cJSON *o, const char *ty, const char *where) {
    if (strcmp(ty, "Prepend") == 0) {
        const char *p = string_field(L, o, "prepend", where);
        return p ? add_norm(L, NORM_PREPEND, NULL, p) : -1;
    }
    static const struct { const char *name; int options; } forms[] = {
        {"NFC", UTF8PROC_STABLE | UTF8PROC_COMPOSE}, {"NFD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE},
        {"NFKC", UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT},
        {"NFKD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT}};
    for (int i = 0; i < 4; i++) {
        if (strcmp(ty, forms[i].name) != 0) continue;
        if (add_norm(L, NORM_UNICODE, NULL, "")) return -1;
        L->t->norm[L->t->n_norm - 1].unicode = forms[i].options;
        return 0;
    }
    if (strcmp(ty, "Replace") == 0) {
        int is_regex;
        const char *from = pattern_of(L, o, where, &is_regex);
        const char *to = from ? string_field(L, o, "content", where) : NULL;
        if (!to) return -1;
        if (is_regex || !from[0])
            return sl_errorf("%s: %s: a Replace normalizer with a %s pattern is not supported (expected a "
                             "non-empty String)", L->path, where, is_regex ? "Regex" : "empty");
        return add_norm(L, NORM_REPLACE, from, to);
    }
    return sl_errorf("%s: %s: normalizer \"%s\" is not supported (supported: NFC, NFD, NFKC, NFKD, Prepend, "
                     "Replace with a String pattern, Sequence of them); its text would not be encoded as Hugging "
                     "Face does", L->path, where, ty);
}

// ---------------------------------------------------------------- pre-tokenizer

static tok_pre *add_pre(loader *L, int kind) {
    sl_tokenizer *t = L->t;
    tok_pre *p = realloc(t->pre, (size_t)(t->n_pre + 1) * sizeof *p);
    if (!p) { sl_errorf("out of memory reading the pre-tokenizer"); return NULL; }
    t->pre = p;
    t->pre[t->n_pre] = (tok_pre){.kind = kind};
    return &t->pre[t->n_pre++];
}

static int behavior_of(const loader *L, const cJSON *o, const char *where) {
    static const char *const names[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    const char *b = string_field(L, o, "behavior", where);
    if (!b) return -1;
    for (int i = 0; i < 5; i++)
        if (strcmp(b, names[i]) == 0) return i;
    return sl_errorf("%s: %s.behavior \"%s\": expected Isolated, Removed, MergedWithPrevious, MergedWithNext or "
                     "Contiguous", L->path, where, b), -1;
}

static int prepend_scheme(const loader *L, const cJSON *o, const char *where) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "prepend_scheme");
    if (!v || cJSON_IsNull(v)) {  // tokenizers before 0.14 wrote add_prefix_space instead
        int a = bool_field(L, o, "add_prefix_space", 1, where);
        return a < 0 ? -1 : a ? PREPEND_ALWAYS : PREPEND_NEVER;
    }
    if (cJSON_IsString(v) && strcmp(v->valuestring, "always") == 0) return PREPEND_ALWAYS;
    if (cJSON_IsString(v) && strcmp(v->valuestring, "first") == 0) return PREPEND_FIRST;
    if (cJSON_IsString(v) && strcmp(v->valuestring, "never") == 0) return PREPEND_NEVER;
    return sl_errorf("%s: %s.prepend_scheme: expected \"always\", \"first\" or \"never\"", L->path, where), -1;
}

static int metaspace_replacement(const loader *L, const cJSON *o, const char *where, char *out, int *n) {
    const char *r = string_field(L, o, "replacement", where);
    if (!r) return -1;
    size_t len = strlen(r);
    utf8proc_int32_t cp;
    if (len == 0 || len > 4 || utf8proc_iterate((const utf8proc_uint8_t *)r, (utf8proc_ssize_t)len, &cp) != (utf8proc_ssize_t)len)
        return sl_errorf("%s: %s.replacement: expected one character", L->path, where);
    memcpy(out, r, len);
    *n = (int)len;
    return 0;
}

static int read_pre(loader *L, const cJSON *o, const char *ty, const char *where) {
    if (L->t->n_pre && L->t->pre[L->t->n_pre - 1].kind == PRE_BYTE_LEVEL)
        return sl_errorf("%s: %s: a pre-tokenizer step after ByteLevel is not supported (it would see ByteLevel's "
                         "characters)", L->path, where);
    if (strcmp(ty, "ByteLevel") == 0) {
        int aps = bool_field(L, o, "add_prefix_space", 0, where), rx = bool_field(L, o, "use_regex", 1, where);
        if (aps < 0 || rx < 0) return -1;
        tok_pre *p = add_pre(L, PRE_BYTE_LEVEL);
        if (!p) return -1;
        p->add_prefix_space = aps;
        if (rx && !L->t->re && !(L->t->re = tok_gpt2_regex())) return -1;
        p->re = rx ? L->t->re : NULL;
        L->has_byte_level = 1;
        return 0;
    }
    if (strcmp(ty, "Split") == 0) {
        int is_regex, behavior = behavior_of(L, o, where), invert = bool_field(L, o, "invert", 0, where);
        const char *pat = behavior < 0 || invert < 0 ? NULL : pattern_of(L, o, where, &is_regex);
        if (!pat) return -1;
        char what[128];
        snprintf(what, sizeof what, "%s.pattern of %s", where, L->path);
        pcre2_code *re;
        for (const char *c = pat; is_regex && *c; c++) {  // Oniguruma's \h is a hex digit, PCRE2's a blank
            if (*c == '\\' && (c[1] == 'h' || c[1] == 'H'))
                return sl_errorf("%s: %s.pattern: \\%c means a hex digit to tokenizers (Oniguruma) and a "
                                 "horizontal space to PCRE2; not supported", L->path, where, c[1]);
            if (*c == '\\' && c[1]) c++;
        }
        // tokenizers' Oniguruma (Ruby syntax) reads ^ and $ at every line: PCRE2's multiline mode
        if (is_regex) re = tok_compile_regex(pat, strlen(pat), PCRE2_MULTILINE, what);
        else {
            int err;
            PCRE2_SIZE off;
            re = pcre2_compile((PCRE2_SPTR)pat, strlen(pat), PCRE2_LITERAL | PCRE2_UTF | PCRE2_MATCH_INVALID_UTF, &err,
                               &off, NULL);
            if (!re) sl_errorf("compiling %s failed", what);
        }
        if (!re) return -1;
        uint32_t min_len = 1;
        if (pcre2_pattern_info(re, PCRE2_INFO_MINLENGTH, &min_len) != 0 || min_len == 0) {
            pcre2_code_free(re);
            return sl_errorf("%s: %s.pattern may match empty text, which is not supported", L->path, where);
        }
        tok_pre *p = add_pre(L, PRE_SPLIT);
        if (!p) { pcre2_code_free(re); return -1; }
        p->re = re;
        p->behavior = behavior;
        p->invert = invert;
        return 0;
    }
    if (strcmp(ty, "Metaspace") == 0) {
        char r[8];
        int rn = 0, scheme = prepend_scheme(L, o, where), split = bool_field(L, o, "split", 1, where);
        if (scheme < 0 || split < 0 || metaspace_replacement(L, o, where, r, &rn)) return -1;
        tok_pre *p = add_pre(L, PRE_METASPACE);
        if (!p) return -1;
        memcpy(p->repl, r, (size_t)rn);
        p->repl_n = rn;
        p->prepend = scheme;
        p->split = split;
        return 0;
    }
    if (strcmp(ty, "Digits") == 0) {
        int ind = bool_field(L, o, "individual_digits", 0, where);
        tok_pre *p = ind < 0 ? NULL : add_pre(L, PRE_DIGITS);
        if (!p) return -1;
        p->individual = ind;
        return 0;
    }
    return sl_errorf("%s: %s: pre-tokenizer \"%s\" is not supported (supported: ByteLevel, Split, Metaspace, "
                     "Digits, Sequence of them)", L->path, where, ty);
}

// ---------------------------------------------------------------- decoder

static int add_dec_replace(loader *L, const char *from, const char *to, const char *where) {
    if (L->dec_from) return sl_errorf("%s: %s: a second Replace / Metaspace step in the decoder is not supported",
                                      L->path, where);
    if (!from[0]) return sl_errorf("%s: %s: an empty Replace pattern", L->path, where);
    if (strlen(to) > 4 * strlen(from))
        return sl_errorf("%s: %s: a Replace that makes its text more than 4 times longer is not supported", L->path,
                         where);
    L->dec_from = dup_str(from);
    L->dec_to = dup_str(to);
    return L->dec_from && L->dec_to ? 0 : -1;
}

static int read_decoder(loader *L, const cJSON *o, const char *ty, const char *where) {
    if (strcmp(ty, "ByteLevel") == 0) { L->has_byte_level = 1; return 0; }
    if (strcmp(ty, "ByteFallback") == 0) { L->dec_byte_fallback = 1; return 0; }
    if (strcmp(ty, "Fuse") == 0) { L->dec_fused = 1; return 0; }  // decoding concatenates anyway
    if (strcmp(ty, "Replace") == 0) {
        int is_regex;
        const char *from = pattern_of(L, o, where, &is_regex);
        const char *to = from ? string_field(L, o, "content", where) : NULL;
        if (!to) return -1;
        if (is_regex) return sl_errorf("%s: %s: a Replace decoder with a Regex pattern is not supported", L->path, where);
        return add_dec_replace(L, from, to, where);
    }
    if (strcmp(ty, "Strip") == 0) {
        const char *c = string_field(L, o, "content", where);
        int start = 0, stop = 0;
        if (!c || sl_json_get_int(o, "start", &start, 0, 0, where) || sl_json_get_int(o, "stop", &stop, 0, 0, where))
            return -1;
        if (strcmp(c, " ") != 0 || stop != 0 || start > 64 || !L->dec_fused || L->t->strip_left)
            return sl_errorf("%s: %s: only one Strip of up to 64 leading spaces after Fuse is supported (content "
                             "\" \", stop 0)", L->path, where);
        L->t->strip_left = start;
        return 0;
    }
    if (strcmp(ty, "Metaspace") == 0) {
        char r[8] = {0};
        int rn = 0, scheme = prepend_scheme(L, o, where);
        if (scheme < 0 || metaspace_replacement(L, o, where, r, &rn) || add_dec_replace(L, r, " ", where)) return -1;
        if (scheme != PREPEND_NEVER) {
            L->t->first_drop_n = rn;
        }
        return 0;
    }
    return sl_errorf("%s: %s: decoder \"%s\" is not supported (supported: ByteLevel, Metaspace, Replace, "
                     "ByteFallback, Fuse, Strip, Sequence of them)", L->path, where, ty);
}

// ---------------------------------------------------------------- vocab, added tokens, merges

static int byte_of_fallback(const char *s) {  // "<0xAB>" -> 0xAB, else -1
    unsigned v;
    char tail;
    if (strlen(s) != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x') return -1;
    if (sscanf(s + 3, "%2x%c", &v, &tail) != 2 || tail != '>') return -1;
    return (int)v;
}

static int read_added(loader *L, const cJSON *list, int *max_id) {
    sl_tokenizer *t = L->t;
    if (!list || cJSON_IsNull(list)) return 0;
    if (!cJSON_IsArray(list)) return sl_errorf("%s: added_tokens: expected an array", L->path);
    int n = cJSON_GetArraySize(list), i = 0;
    t->added = sl_calloc((size_t)n + 1, sizeof *t->added, "added tokens");
    if (!t->added) return -1;
    for (const cJSON *a = list->child; a; a = a->next, i++) {
        char w[64];
        snprintf(w, sizeof w, "added_tokens[%d]", i);
        int id = -1;
        const char *content = cJSON_IsObject(a) ? string_field(L, a, "content", w) : NULL;
        if (!content) return cJSON_IsObject(a) ? -1 : sl_errorf("%s: %s: expected an object", L->path, w);
        if (sl_json_get_int(a, "id", &id, 1, 0, w)) return sl_error_context("%s", L->path);
        if (id >= 1 << 30) return sl_errorf("%s: %s: id %d is beyond any vocabulary (expected below 2^30)", L->path, w, id);
        int special = bool_field(L, a, "special", 0, w), norm = bool_field(L, a, "normalized", 1, w);
        int ls = bool_field(L, a, "lstrip", 0, w), rs = bool_field(L, a, "rstrip", 0, w);
        int sw = bool_field(L, a, "single_word", 0, w);
        if (special < 0 || norm < 0 || ls < 0 || rs < 0 || sw < 0) return -1;
        if (sw) return sl_errorf("%s: %s (\"%s\"): single_word added tokens are not supported", L->path, w, content);
        if (!content[0]) return sl_errorf("%s: %s: empty content", L->path, w);
        tok_added *d = &t->added[t->n_added++];
        *d = (tok_added){.id = id, .special = special, .normalized = norm, .lstrip = ls, .rstrip = rs};
        if (!(d->content = dup_str(content))) return -1;
        d->len = (uint32_t)strlen(content);
        if (id > *max_id) *max_id = id;
    }
    return 0;
}

// The lookup bytes of a model-vocab string: raw bytes (byte-level: decoded from bytes_to_unicode) or
// the string itself. Returns the length, or -1 with a message.
static long key_bytes(const loader *L, const char *s, char *out, const char *what) {
    size_t n = strlen(s);
    if (!L->has_byte_level) { memcpy(out, s, n); return (long)n; }
    size_t at = 0;
    long cp = -1;
    long nb = tok_unicode_to_bytes(s, n, out, &at, &cp);
    char tb[256];
    if (nb < 0)
        sl_errorf("%s: %s \"%s\": %s at byte %zu is outside the byte-level alphabet (bytes_to_unicode's code points)",
                  L->path, what, tok_for_message(s, tb, sizeof tb), cp < 0 ? "invalid UTF-8" : "a character", at);
    return nb;
}

static int read_vocab(loader *L, const cJSON *vocab, int max_added) {
    sl_tokenizer *t = L->t;
    if (!cJSON_IsObject(vocab)) return sl_errorf("%s: model.vocab: expected an object mapping tokens to ids", L->path);
    int n = max_added + 1;
    size_t pool = 1;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= 1 << 30 || e->valuedouble != floor(e->valuedouble)) {
            char tb[256];
            return sl_errorf("%s: model.vocab \"%s\": expected a non-negative integer id", L->path,
                             tok_for_message(e->string, tb, sizeof tb));
        }
        if (e->valueint + 1 > n) n = e->valueint + 1;
        pool += strlen(e->string) + 1;
    }
    for (int i = 0; i < t->n_added; i++) pool += t->added[i].len + 1;
    if ((size_t)n > (size_t)cJSON_GetArraySize(vocab) + (size_t)t->n_added)  // before allocating n of anything
        return sl_errorf("%s: ids run to %d but model.vocab and added_tokens hold %d and %d: expected every id from 0 up",
                         L->path, n - 1, cJSON_GetArraySize(vocab), t->n_added);
    t->n_vocab = n;
    t->tok_bytes = sl_calloc((size_t)n, sizeof(char *), "token table");
    t->tok_len = sl_calloc((size_t)n, sizeof(uint32_t), "token lengths");
    t->tok_names = sl_calloc((size_t)n, sizeof(char *), "token names");
    t->bytes_pool = sl_malloc(pool, "token bytes");
    t->vocab_cap = tok_pow2_at_least((size_t)n * 2);
    t->vocab_slots = sl_calloc(t->vocab_cap, sizeof(uint32_t), "vocab hash map");
    if (!t->tok_bytes || !t->tok_len || !t->tok_names || !t->bytes_pool || !t->vocab_slots) return -1;
    size_t used = 0;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int id = e->valueint;
        char tb[256], tb2[256];
        if (t->tok_bytes[id])
            return sl_errorf("%s: model.vocab: id %d is given to both \"%s\" and \"%s\"", L->path, id,
                             tok_for_message(t->tok_names[id], tb, sizeof tb), tok_for_message(e->string, tb2, sizeof tb2));
        long nb = key_bytes(L, e->string, t->bytes_pool + used, "model.vocab token");
        if (nb < 0) return -1;
        if (nb == 0) return sl_errorf("%s: model.vocab: id %d is an empty token", L->path, id);
        t->tok_bytes[id] = t->bytes_pool + used;
        t->tok_len[id] = (uint32_t)nb;
        t->tok_names[id] = e->string;
        used += (size_t)nb;
        int other = tok_vocab_find(t, t->tok_bytes[id], t->tok_len[id]);
        if (other >= 0)
            return sl_errorf("%s: model.vocab: \"%s\" (id %d) and \"%s\" (id %d) are the same token", L->path,
                             tok_for_message(t->tok_names[other], tb, sizeof tb), other,
                             tok_for_message(e->string, tb2, sizeof tb2), id);
        tok_vocab_insert(t, id);
    }
    for (int i = 0; i < t->n_added; i++) {  // an added token outside the model's vocab keeps its text
        tok_added *a = &t->added[i];
        if (t->tok_bytes[a->id]) continue;
        memcpy(t->bytes_pool + used, a->content, a->len);
        t->tok_bytes[a->id] = t->bytes_pool + used;
        t->tok_len[a->id] = a->len;
        t->tok_names[a->id] = a->content;
        used += a->len;
    }
    for (int id = 0; id < n; id++)
        if (!t->tok_bytes[id])
            return sl_errorf("%s: id %d is in neither model.vocab nor added_tokens (ids run to %d); expected every id "
                             "from 0 up", L->path, id, n - 1);
    return 0;
}

static int merge_halves(const loader *L, const cJSON *m, int i, const char **a, const char **b, char *buf) {
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) && cJSON_IsString(m->child->next)) {
        *a = m->child->valuestring;
        *b = m->child->next->valuestring;
        return 0;
    }
    const char *sp = cJSON_IsString(m) ? strchr(m->valuestring, ' ') : NULL;
    if (!sp || strchr(sp + 1, ' '))
        return sl_errorf("%s: model.merges[%d]: expected \"LEFT RIGHT\" (one space) or [LEFT, RIGHT]", L->path, i);
    size_t n = (size_t)(sp - m->valuestring);
    memcpy(buf, m->valuestring, n);
    buf[n] = '\0';
    *a = buf;
    *b = sp + 1;
    return 0;
}

static int read_merges(loader *L, const cJSON *merges) {
    sl_tokenizer *t = L->t;
    if (!merges || cJSON_IsNull(merges)) return tok_merges_alloc(t, 1);
    if (!cJSON_IsArray(merges)) return sl_errorf("%s: model.merges: expected an array", L->path);
    int n = cJSON_GetArraySize(merges), i = 0;
    size_t longest = 0;
    for (const cJSON *m = merges->child; m; m = m->next) {
        size_t len = cJSON_IsString(m) ? strlen(m->valuestring) : 0;
        for (const cJSON *h = cJSON_IsArray(m) ? m->child : NULL; h; h = h->next)
            len += cJSON_IsString(h) ? strlen(h->valuestring) + 1 : 0;
        if (len > longest) longest = len;
    }
    char *half = sl_malloc(longest + 1, "merge scratch"), *key = sl_malloc(2 * longest + 2, "merge scratch");
    int rc = !half || !key || tok_merges_alloc(t, (size_t)n) ? -1 : 0;
    for (const cJSON *m = merges->child; m && rc == 0; m = m->next, i++) {
        const char *a = NULL, *b = NULL;
        if ((rc = merge_halves(L, m, i, &a, &b, half))) break;
        char what[64];
        snprintf(what, sizeof what, "model.merges[%d] half", i);
        long na = key_bytes(L, a, key, what), nb = na < 0 ? -1 : key_bytes(L, b, key + na, what);
        if (na < 0 || nb < 0) { rc = -1; break; }
        int ia = tok_vocab_find(t, key, (size_t)na), ib = tok_vocab_find(t, key + na, (size_t)nb);
        int im = tok_vocab_find(t, key, (size_t)(na + nb));
        if (ia < 0 || ib < 0 || im < 0) {
            char ta[256], tb[256];
            rc = sl_errorf("%s: model.merges[%d] (\"%s\" \"%s\"): %s is not in model.vocab", L->path, i,
                           tok_for_message(a, ta, sizeof ta), tok_for_message(b, tb, sizeof tb),
                           ia < 0 ? "the left token" : ib < 0 ? "the right token" : "the merged token");
            break;
        }
        tok_merge_add(t, ia, ib, im);
    }
    free(half);
    free(key);
    return rc;
}

static int read_model(loader *L, const cJSON *model, int max_added) {
    sl_tokenizer *t = L->t;
    const char *ty = type_of(model);
    if (!cJSON_IsObject(model)) return sl_errorf("%s: model: expected an object", L->path);
    if (ty && strcmp(ty, "BPE") != 0)
        return sl_errorf("%s: model.type \"%s\": only BPE tokenizers are supported (GPT-2, LLaMA, Mistral, Qwen)",
                         L->path, ty);
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (drop && !cJSON_IsNull(drop) && !(cJSON_IsNumber(drop) && drop->valuedouble == 0))
        return sl_errorf("%s: model.dropout: BPE dropout is not supported (expected null)", L->path);
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, affixes[i]);
        if (v && !cJSON_IsNull(v) && !(cJSON_IsString(v) && !v->valuestring[0]))
            return sl_errorf("%s: model.%s: not supported (expected null)", L->path, affixes[i]);
    }
    int bf = bool_field(L, model, "byte_fallback", 0, "model"), fu = bool_field(L, model, "fuse_unk", 0, "model");
    int im = bool_field(L, model, "ignore_merges", 0, "model");
    if (bf < 0 || fu < 0 || im < 0) return -1;
    t->byte_fallback = bf;
    t->fuse_unk = fu;
    t->ignore_merges = im;
    if (read_vocab(L, cJSON_GetObjectItemCaseSensitive(model, "vocab"), max_added)) return -1;
    t->unk_id = -1;
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (cJSON_IsString(unk)) {
        t->unk_id = tok_vocab_find(t, unk->valuestring, strlen(unk->valuestring));
        if (t->unk_id < 0) return sl_errorf("%s: model.unk_token \"%s\" is not in model.vocab", L->path, unk->valuestring);
    }
    for (int b = 0; b < 256; b++) {
        if (L->has_byte_level) {
            char c = (char)b;
            t->byte_id[b] = tok_vocab_find(t, &c, 1);
            if (t->byte_id[b] < 0)
                return sl_errorf("%s: model.vocab has no token for byte 0x%02x; a byte-level vocab needs all 256",
                                 L->path, b);
        } else {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->byte_id[b] = bf ? tok_vocab_find(t, name, 6) : -1;
        }
    }
    return read_merges(L, cJSON_GetObjectItemCaseSensitive(model, "merges"));
}

// ---------------------------------------------------------------- post-processor

static int find_token(const sl_tokenizer *t, const char *s) {
    for (int i = 0; i < t->n_added; i++)
        if (strcmp(t->added[i].content, s) == 0) return t->added[i].id;
    return tok_vocab_find(t, s, strlen(s));
}

static int push_ids(int32_t **list, int *n, const cJSON *ids, const char *path, const char *where) {
    if (!cJSON_IsArray(ids)) return sl_errorf("%s: %s.ids: expected an array of ids", path, where);
    for (const cJSON *v = ids->child; v; v = v->next) {
        if (!cJSON_IsNumber(v)) return sl_errorf("%s: %s.ids: expected integers", path, where);
        int32_t *p = realloc(*list, (size_t)(*n + 1) * sizeof *p);
        if (!p) return sl_errorf("out of memory");
        *list = p;
        p[(*n)++] = v->valueint;
    }
    return 0;
}

static int read_template(loader *L, const cJSON *o, const char *where) {
    sl_tokenizer *t = L->t;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(o, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(o, "special_tokens");
    if (!cJSON_IsArray(single)) return sl_errorf("%s: %s.single: expected an array", L->path, where);
    int seen_a = 0, i = 0;
    for (const cJSON *p = single->child; p; p = p->next, i++) {
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(p, "SpecialToken");
        const cJSON *sq = cJSON_GetObjectItemCaseSensitive(p, "Sequence");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(st ? st : sq, "id");
        if (!cJSON_IsString(id))
            return sl_errorf("%s: %s.single[%d]: expected {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": ...}",
                             L->path, where, i);
        if (sq) {
            if (strcmp(id->valuestring, "A") != 0 || seen_a)
                return sl_errorf("%s: %s.single[%d]: expected sequence A once", L->path, where, i);
            seen_a = 1;
            continue;
        }
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(specials, id->valuestring);
        char w[160];
        snprintf(w, sizeof w, "%s.special_tokens[\"%.64s\"]", where, id->valuestring);
        if (!sp) return sl_errorf("%s: %s: not defined", L->path, w);
        if (push_ids(seen_a ? &t->suffix : &t->prefix, seen_a ? &t->n_suffix : &t->n_prefix,
                     cJSON_GetObjectItemCaseSensitive(sp, "ids"), L->path, w))
            return -1;
    }
    if (!seen_a) return sl_errorf("%s: %s.single: no sequence A", L->path, where);
    return 0;
}

static int read_post(loader *L, const cJSON *o, const char *ty, const char *where) {
    if (strcmp(ty, "ByteLevel") == 0) return 0;  // offsets only
    if (strcmp(ty, "TemplateProcessing") == 0) return read_template(L, o, where);
    return sl_errorf("%s: %s: post-processor \"%s\" is not supported (supported: TemplateProcessing, ByteLevel, "
                     "Sequence)", L->path, where, ty);
}

// ---------------------------------------------------------------- what decoding writes

// One token's decoded bytes into out: the byte of a <0xXX> token (ByteFallback), an added token's or a
// byte-level token's own bytes, else the string with the decoder's Replace / Metaspace applied (the
// replacement dropped instead where `drop`: the Metaspace decoder's first token). Returns the length.
static size_t decode_token(const loader *L, int id, int special, int drop, char *out) {
    const sl_tokenizer *t = L->t;
    const char *s = t->tok_bytes[id];
    size_t len = t->tok_len[id], o = 0;
    char name[8];
    int fb = L->dec_byte_fallback && len == 6 ? (memcpy(name, s, 6), name[6] = '\0', byte_of_fallback(name)) : -1;
    if (fb >= 0 && !special) {
        out[0] = (char)fb;
        return 1;
    }
    if (special || L->has_byte_level || !L->dec_from) {
        memcpy(out, s, len);
        return len;
    }
    size_t fl = strlen(L->dec_from), tl = drop ? 0 : strlen(L->dec_to);
    for (size_t i = 0; i < len;) {
        if (i + fl <= len && memcmp(s + i, L->dec_from, fl) == 0) {
            memcpy(out + o, L->dec_to, tl);
            o += tl;
            i += fl;
        } else out[o++] = s[i++];
    }
    return o;
}

static int decoded_tokens(loader *L) {
    sl_tokenizer *t = L->t;
    int n = t->n_vocab, first = t->first_drop_n > 0;
    unsigned char *is_added = sl_calloc((size_t)n, 1, "added token flags");
    t->dec_bytes = sl_calloc((size_t)n, sizeof(char *), "decoded tokens");
    t->dec_len = sl_calloc((size_t)n, sizeof(uint32_t), "decoded token lengths");
    t->first_bytes = first ? sl_calloc((size_t)n, sizeof(char *), "first-token forms") : NULL;
    t->first_len = first ? sl_calloc((size_t)n, sizeof(uint32_t), "first-token lengths") : NULL;
    size_t pool = 1;
    for (int id = 0; id < n; id++) pool += t->tok_len[id] * (first ? 5 : 4) + 1;  // a Replace may lengthen a token
    t->dec_pool = sl_malloc(pool, "decoded token bytes");
    int rc = !is_added || !t->dec_bytes || !t->dec_len || !t->dec_pool || (first && (!t->first_bytes || !t->first_len));
    for (int i = 0; i < t->n_added && !rc; i++) is_added[t->added[i].id] = 1;
    size_t used = 0;
    for (int id = 0; id < n && !rc; id++) {
        t->dec_bytes[id] = t->dec_pool + used;
        t->dec_len[id] = (uint32_t)decode_token(L, id, is_added[id], 0, t->dec_bytes[id]);
        used += t->dec_len[id];
        if (!first) continue;
        t->first_bytes[id] = t->dec_pool + used;
        t->first_len[id] = (uint32_t)decode_token(L, id, is_added[id], 1, t->first_bytes[id]);
        used += t->first_len[id];
    }
    free(is_added);
    return rc ? -1 : 0;
}

// ---------------------------------------------------------------- tokenizer_config.json

// bos_token / eos_token: a string or {"content": ...}. -1 when absent or not a token.
static int config_token(const sl_tokenizer *t, const cJSON *cfg, const char *key, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v)) return -1;
    int id = find_token(t, v->valuestring);
    if (id < 0)
        fprintf(stderr, "warning: %s: %s \"%s\" is not a token of the tokenizer; ignored\n", path, key, v->valuestring);
    return id;
}

static int read_config(sl_tokenizer *t, const char *config_path) {
    t->bos_id = -1;
    t->eot_id = find_token(t, SL_EOT_STRING);
    if (!config_path) return 0;
    cJSON *cfg = sl_json_read_strict(config_path);
    if (!cfg) return -1;
    int eos = config_token(t, cfg, "eos_token", config_path);
    t->bos_id = config_token(t, cfg, "bos_token", config_path);
    if (eos >= 0) t->eot_id = eos;
    cJSON_Delete(cfg);
    return 0;
}

// Added tokens matched in the normalized text are matched as the normalizer writes them.
static int normalize_added(sl_tokenizer *t) {
    for (int i = 0; i < t->n_added && t->n_norm; i++) {
        tok_added *a = &t->added[i];
        if (!a->normalized) continue;
        char *out;
        size_t n;
        if (tok_normalize(t, a->content, a->len, &out, &n)) return -1;
        free(a->content);
        a->content = out;
        a->len = (uint32_t)n;
    }
    return 0;
}

int tok_load_json(sl_tokenizer *t, const char *path, const char *config_path) {
    cJSON *root = sl_json_read_strict(path);
    if (!root) return -1;
    loader L = {.t = t, .path = path};
    int max_added = -1, rc = -1;
    if (!cJSON_IsObject(root)) {
        sl_errorf("%s: expected a JSON object (a Hugging Face tokenizer.json)", path);
        goto done;
    }
    if (read_steps(&L, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), "pretokenizers", "pre_tokenizer",
                   read_pre) ||
        read_steps(&L, cJSON_GetObjectItemCaseSensitive(root, "decoder"), "decoders", "decoder", read_decoder) ||
        read_steps(&L, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), "normalizers", "normalizer",
                   read_normalizer) ||
        read_added(&L, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), &max_added))
        goto done;
    t->kind = L.has_byte_level ? TOK_BYTE_LEVEL : TOK_CHARS;
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    t->join_space = !dec || cJSON_IsNull(dec);  // tokenizers without a decoder joins the tokens with spaces
    if (read_model(&L, cJSON_GetObjectItemCaseSensitive(root, "model"), max_added) ||
        read_steps(&L, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), "processors", "post_processor",
                   read_post) ||
        decoded_tokens(&L) || normalize_added(t) || read_config(t, config_path))
        goto done;
    tok_index_added(t);
    for (int i = 0; i < t->n_prefix + t->n_suffix; i++) {
        int id = i < t->n_prefix ? t->prefix[i] : t->suffix[i - t->n_prefix];
        if (id < 0 || id >= t->n_vocab) {
            sl_errorf("%s: post_processor: template id %d is outside the vocab [0, %d)", path, id, t->n_vocab);
            goto done;
        }
    }
    rc = 0;
done:
    free(t->tok_names);  // they point into the tree
    t->tok_names = NULL;
    free(L.dec_from);
    free(L.dec_to);
    cJSON_Delete(root);
    return rc;
}
