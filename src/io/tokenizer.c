// tokenizer.c: GPT-2 byte-level BPE loading, encoding and decoding (training is in bpe_train.c).
// Owns: the vocab (each token's raw bytes, plus a bytes -> id hash map), the merge table (a hash map
// from an id pair to its rank and merged id), the compiled pre-tokenisation regex, and the byte <->
// code point tables of bytes_to_unicode.
// Invariants: after a successful load every id 0..n_vocab-1 has bytes; byte_id[b] is the id of the
// one-byte token b (all 256 exist); every merge (a, b) -> m satisfies bytes(m) == bytes(a) + bytes(b);
// the tokenizer is never modified after load, so encode/decode are thread-safe (each encode call
// keeps its own word cache and PCRE2 match data).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "shardlm/tokenizer.h"
#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/json_get.h"

#include <cjson/cJSON.h>
#include <pcre2.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct sl_tokenizer {
    int n_vocab;
    char **tok_bytes;      // (n_vocab) raw bytes of each token (one allocation: bytes_pool)
    uint32_t *tok_len;     // (n_vocab)
    char *bytes_pool;
    const char **tok_names; // (n_vocab) while loading: each id's vocab.json string (for messages)
    uint32_t *vocab_slots; // (vocab_cap) open addressing: id + 1, 0 = empty
    size_t vocab_cap;
    int32_t byte_id[256];
    int eot_id;
    int n_merges;
    uint64_t *merge_keys;  // (merge_cap) (a << 32 | b), UINT64_MAX = empty
    int32_t *merge_rank;   // (merge_cap)
    int32_t *merge_id;     // (merge_cap)
    size_t merge_cap;
    pcre2_code *re;
};

// ---------------------------------------------------------------- bytes_to_unicode

static uint32_t byte_to_cp[256];
static int16_t cp_to_byte[512];  // every mapped code point is < 512; -1 = not a byte
static void fill_byte_tables(void) {
    for (int i = 0; i < 512; i++) cp_to_byte[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        uint32_t cp = printable ? (uint32_t)b : (uint32_t)(256 + n++);
        byte_to_cp[b] = cp;
        cp_to_byte[cp] = (int16_t)b;
    }
}

static void init_byte_tables(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fill_byte_tables);
}

uint32_t sl_byte_to_unicode(uint8_t b) {
    init_byte_tables();
    return byte_to_cp[b];
}

// Decodes a vocab/merges string (UTF-8 of mapped code points) into raw bytes written to out
// (capacity >= n). Returns the byte count, or -1 if s holds something that is no byte's code point:
// then *bad_at is its byte offset in s and *bad_cp the code point (-1: not valid UTF-8).
static long unicode_to_bytes(const char *s, size_t n, char *out, size_t *bad_at, long *bad_cp) {
    size_t i = 0, o = 0;
    while (i < n) {
        const unsigned char *c = (const unsigned char *)s + i;
        int len = c[0] < 0x80 ? 1 : (c[0] & 0xE0) == 0xC0 ? 2 : (c[0] & 0xF0) == 0xE0 ? 3 : (c[0] & 0xF8) == 0xF0 ? 4 : 0;
        long cp = len == 1 ? c[0] : len ? (long)(c[0] & (0x7F >> len)) : -1;
        for (int k = 1; k < len && cp >= 0; k++)
            cp = i + (size_t)k < n && (c[k] & 0xC0) == 0x80 ? cp << 6 | (c[k] & 0x3F) : -1;
        if (cp < 0 || cp >= 512 || cp_to_byte[cp] < 0) {
            if (bad_at) *bad_at = i;
            if (bad_cp) *bad_cp = cp;
            return -1;
        }
        out[o++] = (char)cp_to_byte[cp];
        i += (size_t)len;
    }
    return (long)o;
}

// A vocab token for error messages: at most 60 bytes, control bytes as \xNN.
static const char *token_for_message(const char *s, char *buf, size_t cap) {
    size_t o = 0, n = strlen(s);
    for (size_t i = 0; i < n && o + 8 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i == 60) { memcpy(buf + o, "...", 3); o += 3; break; }
        if (c < 0x20 || c == 0x7F) o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
        else buf[o++] = (char)c;
    }
    buf[o] = '\0';
    return buf;
}

// ---------------------------------------------------------------- hashing

static uint64_t hash_bytes(const char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) { h ^= (unsigned char)p[i]; h *= 0x100000001b3ULL; }
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

static int vocab_find(const sl_tokenizer *t, const char *p, size_t n) {
    size_t mask = t->vocab_cap - 1;
    for (size_t i = hash_bytes(p, n) & mask;; i = (i + 1) & mask) {
        uint32_t s = t->vocab_slots[i];
        if (s == 0) return -1;
        int id = (int)s - 1;
        if (t->tok_len[id] == n && memcmp(t->tok_bytes[id], p, n) == 0) return id;
    }
}

static void vocab_insert(sl_tokenizer *t, int id) {
    size_t mask = t->vocab_cap - 1;
    size_t i = hash_bytes(t->tok_bytes[id], t->tok_len[id]) & mask;
    while (t->vocab_slots[i] != 0) i = (i + 1) & mask;
    t->vocab_slots[i] = (uint32_t)id + 1;
}

static size_t merge_slot(const sl_tokenizer *t, uint64_t key) {
    size_t mask = t->merge_cap - 1;
    size_t i = hash_u64(key) & mask;
    while (t->merge_keys[i] != key && t->merge_keys[i] != UINT64_MAX) i = (i + 1) & mask;
    return i;
}

// ---------------------------------------------------------------- regex

static pcre2_code *compile_gpt2_regex(void) {
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)GPT2_PATTERN, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        sl_errorf("compiling the GPT-2 pre-tokenisation regex failed at offset %zu: %s", (size_t)off, msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // optional: pcre2_match falls back to the interpreter
    return re;
}

// Pre-tokenises text[0..len) with the compiled regex (no special-token handling).
static int pretokenize_span(const pcre2_code *re, pcre2_match_data *md, const char *text, size_t len,
                            sl_piece_fn piece, void *ctx) {
    size_t off = 0;
    while (off < len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)text, len, off, 0, md, NULL);
        size_t s = len, e = len;
        if (rc >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            s = ov[0]; e = ov[1];
        } else if (rc != PCRE2_ERROR_NOMATCH) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return sl_errorf("pre-tokenising at byte %zu: PCRE2 match error: %s", off, msg);
        }
        if (s > off) {  // bytes the regex skipped (invalid UTF-8): keep them as their own piece
            int r = piece(ctx, text + off, s - off);
            if (r) return r;
        }
        if (e > s) {
            int r = piece(ctx, text + s, e - s);
            if (r) return r;
        }
        if (e <= off) break;  // cannot happen (no empty matches), but never loop forever
        off = e;
    }
    return 0;
}

static int pretokenize_with(const pcre2_code *re, const char *text, size_t len, int split_special,
                            sl_piece_fn piece, sl_special_fn special, void *ctx) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md) return sl_errorf("out of memory creating PCRE2 match data");
    const size_t eot_n = sizeof SL_EOT_STRING - 1;
    size_t off = 0;
    int rc = 0;
    while (off < len && rc == 0) {
        const char *hit = split_special ? memmem(text + off, len - off, SL_EOT_STRING, eot_n) : NULL;
        size_t end = hit ? (size_t)(hit - text) : len;
        rc = pretokenize_span(re, md, text + off, end - off, piece, ctx);
        if (rc == 0 && hit) rc = special ? special(ctx) : 0;
        off = hit ? end + eot_n : len;
    }
    pcre2_match_data_free(md);
    return rc;
}

int sl_pretokenize(const char *text, size_t len, int split_special, sl_piece_fn piece, sl_special_fn special,
                   void *ctx) {
    pcre2_code *re = compile_gpt2_regex();
    if (!re) return -1;
    int rc = pretokenize_with(re, text, len, split_special, piece, special, ctx);
    pcre2_code_free(re);
    return rc;
}

// ---------------------------------------------------------------- loading

void sl_tokenizer_free(sl_tokenizer *t) {
    if (!t) return;
    free(t->tok_bytes);
    free(t->tok_len);
    free(t->bytes_pool);
    free(t->vocab_slots);
    free(t->merge_keys);
    free(t->merge_rank);
    free(t->merge_id);
    if (t->re) pcre2_code_free(t->re);
    free(t);
}

static const char *json_kind(const cJSON *v) {
    return cJSON_IsString(v) ? "a string" : cJSON_IsBool(v) ? "a boolean" : cJSON_IsNull(v) ? "null"
           : cJSON_IsArray(v) ? "an array" : cJSON_IsObject(v) ? "an object" : "a number";
}

// Checks one vocab.json entry (token string -> id of n) and decodes it into pool + *used.
static int vocab_entry(sl_tokenizer *t, const char *path, const cJSON *e, int n, size_t *used) {
    char tb[256];
    const char *tok = token_for_message(e->string, tb, sizeof tb);
    if (!cJSON_IsNumber(e))
        return sl_errorf("%s: token \"%s\": expected an integer id in [0, %d), found %s", path, tok, n, json_kind(e));
    double v = e->valuedouble;
    if (!(v >= 0 && v < n) || v != floor(v)) {
        char num[40];
        return sl_errorf("%s: token \"%s\": expected an integer id in [0, %d) (the vocab has %d entries), found %s",
                         path, tok, n, n, sl_json_number_str(num, sizeof num, v));
    }
    int id = (int)v;
    if (t->tok_bytes[id]) {
        char first[256];
        return sl_errorf("%s: token \"%s\": id %d is already taken by token \"%s\"; expected each id in [0, %d) "
                         "exactly once", path, tok, id, token_for_message(t->tok_names[id], first, sizeof first), n);
    }
    size_t at = 0;
    long cp = -1;
    long nb = unicode_to_bytes(e->string, strlen(e->string), t->bytes_pool + *used, &at, &cp);
    if (nb < 0 && cp < 0)
        return sl_errorf("%s: token \"%s\" (id %d): invalid UTF-8 at byte %zu", path, tok, id, at);
    if (nb < 0)
        return sl_errorf("%s: token \"%s\" (id %d): character U+%04lX at byte %zu is outside GPT-2's byte alphabet "
                         "(expected only the code points bytes_to_unicode maps bytes to: U+0021-U+007E, "
                         "U+00A1-U+00AC, U+00AE-U+0143)", path, tok, id, cp, at);
    if (nb == 0) return sl_errorf("%s: empty token (id %d): expected at least one byte", path, id);
    t->tok_names[id] = e->string;
    t->tok_bytes[id] = t->bytes_pool + *used;
    t->tok_len[id] = (uint32_t)nb;
    *used += (size_t)nb;
    return 0;
}

static int load_vocab(sl_tokenizer *t, const char *path) {
    cJSON *root = sl_json_read_strict(path);
    if (!root) return -1;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return sl_errorf("%s: expected a JSON object mapping token strings to ids", path);
    }
    int n = cJSON_GetArraySize(root);
    size_t pool_bytes = 0;
    for (cJSON *e = root->child; e; e = e->next) pool_bytes += strlen(e->string);
    t->n_vocab = n;
    t->tok_bytes = sl_calloc((size_t)n, sizeof(char *), "token table");
    t->tok_len = sl_calloc((size_t)n, sizeof(uint32_t), "token lengths");
    t->tok_names = sl_calloc((size_t)n, sizeof(char *), "token names");
    t->bytes_pool = sl_malloc(pool_bytes + 1, "token bytes");
    int rc = !t->tok_bytes || !t->tok_len || !t->tok_names || !t->bytes_pool ? -1 : 0;
    size_t used = 0;
    for (cJSON *e = root->child; e && rc == 0; e = e->next) rc = vocab_entry(t, path, e, n, &used);
    // the messages above quote the parsed names: they are formatted before the tree goes
    cJSON_Delete(root);
    free(t->tok_names);
    t->tok_names = NULL;
    if (rc) return -1;
    t->vocab_cap = pow2_at_least((size_t)n * 2);
    t->vocab_slots = sl_calloc(t->vocab_cap, sizeof(uint32_t), "vocab hash map");
    if (!t->vocab_slots) return -1;
    for (int id = 0; id < n; id++) {
        if (vocab_find(t, t->tok_bytes[id], t->tok_len[id]) >= 0) {
            return sl_errorf("%s: id %d decodes to the same bytes as id %d", path, id,
                             vocab_find(t, t->tok_bytes[id], t->tok_len[id]));
        }
        vocab_insert(t, id);
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = vocab_find(t, &c, 1);
        if (t->byte_id[b] < 0) return sl_errorf("%s: no token for byte 0x%02x; a byte-level vocab needs all 256", path, b);
    }
    t->eot_id = vocab_find(t, SL_EOT_STRING, sizeof SL_EOT_STRING - 1);
    return 0;
}

static int load_merges(sl_tokenizer *t, const char *path) {
    size_t len;
    char *text = sl_read_text_file(path, &len);
    if (!text) return -1;
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    t->merge_cap = pow2_at_least(lines * 2);
    t->merge_keys = sl_malloc(t->merge_cap * sizeof(uint64_t), "merge table");
    t->merge_rank = sl_malloc(t->merge_cap * sizeof(int32_t), "merge ranks");
    t->merge_id = sl_malloc(t->merge_cap * sizeof(int32_t), "merge ids");
    char *buf = sl_malloc(len + 1, "merge scratch");
    if (!t->merge_keys || !t->merge_rank || !t->merge_id || !buf) { free(text); free(buf); return -1; }
    memset(t->merge_keys, 0xFF, t->merge_cap * sizeof(uint64_t));
    int rc = 0, line_no = 0;
    char *p = text, *end = text + len;
    while (p < end && rc == 0) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *e = nl ? nl : end;
        line_no++;
        size_t n = (size_t)(e - p);
        if (n > 0 && p[n - 1] == '\r') n--;
        if (n == 0 || (line_no == 1 && n >= 8 && memcmp(p, "#version", 8) == 0)) { p = e + 1; continue; }
        char *sp = memchr(p, ' ', n);
        if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - p))) {
            rc = sl_errorf("%s:%d: expected \"LEFT RIGHT\" (two tokens, one space), found \"%.*s\"", path, line_no,
                           (int)(n > 80 ? 80 : n), p);
            break;
        }
        long na = unicode_to_bytes(p, (size_t)(sp - p), buf, NULL, NULL);
        long nb = na < 0 ? -1 : unicode_to_bytes(sp + 1, n - (size_t)(sp + 1 - p), buf + na, NULL, NULL);
        if (na <= 0 || nb <= 0) {
            rc = sl_errorf("%s:%d: merge \"%.*s\" has an empty half or a character outside GPT-2's byte alphabet",
                           path, line_no, (int)n, p);
            break;
        }
        int a = vocab_find(t, buf, (size_t)na), b = vocab_find(t, buf + na, (size_t)nb);
        int m = vocab_find(t, buf, (size_t)(na + nb));
        if (a < 0 || b < 0 || m < 0) {
            rc = sl_errorf("%s:%d: merge \"%.*s\": %s is not in the vocab", path, line_no, (int)n, p,
                           a < 0 ? "the left token" : b < 0 ? "the right token" : "the merged token");
            break;
        }
        uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
        size_t s = merge_slot(t, key);
        if (t->merge_keys[s] == UINT64_MAX) {  // a duplicate merge keeps its first (best) rank
            t->merge_keys[s] = key;
            t->merge_rank[s] = t->n_merges;
            t->merge_id[s] = m;
        }
        t->n_merges++;
        p = e + 1;
    }
    free(buf);
    free(text);
    return rc;
}

int sl_tokenizer_load(sl_tokenizer **out, const char *vocab_path, const char *merges_path) {
    *out = NULL;
    init_byte_tables();
    sl_tokenizer *t = sl_calloc(1, sizeof *t, "tokenizer");
    if (!t) return -1;
    if (load_vocab(t, vocab_path) != 0 || load_merges(t, merges_path) != 0 || !(t->re = compile_gpt2_regex())) {
        sl_tokenizer_free(t);
        return sl_error_context("loading tokenizer (%s, %s)", vocab_path, merges_path);
    }
    *out = t;
    return 0;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int sl_tokenizer_load_dir(sl_tokenizer **out, const char *dir) {
    char v[4096], m[4096];
    snprintf(v, sizeof v, "%s/vocab.json", dir);
    snprintf(m, sizeof m, "%s/merges.txt", dir);
    if (file_exists(v) && file_exists(m)) return sl_tokenizer_load(out, v, m);
    snprintf(v, sizeof v, "%s/encoder.json", dir);
    snprintf(m, sizeof m, "%s/vocab.bpe", dir);
    if (file_exists(v) && file_exists(m)) return sl_tokenizer_load(out, v, m);
    *out = NULL;
    return sl_errorf("%s: expected vocab.json + merges.txt (or encoder.json + vocab.bpe) in this directory", dir);
}

int sl_tokenizer_vocab_size(const sl_tokenizer *t) { return t->n_vocab; }

int sl_tokenizer_check_model_vocab(const sl_tokenizer *t, const char *tok_where, int model_vocab,
                                   const char *model_where, int padded_ok) {
    if (t->n_vocab == model_vocab) return 0;
    if (padded_ok && t->n_vocab < model_vocab) {  // trained weights with a padded vocabulary, as many HF models
        fprintf(stderr, "note: the model's vocab_size %d (%s) is larger than the tokenizer's %d tokens (%s); "
                        "the extra rows are never produced\n", model_vocab, model_where, t->n_vocab, tok_where);
        return 0;
    }
    return sl_errorf("the model's vocab_size %d (%s) differs from the tokenizer's %d tokens (%s): %s; expected the "
                     "tokenizer the model was trained with (--tokenizer DIR)", model_vocab, model_where, t->n_vocab,
                     tok_where, t->n_vocab > model_vocab ? "its ids would not fit" : "ids would name different tokens");
}
int sl_tokenizer_eot_id(const sl_tokenizer *t) { return t->eot_id; }
int sl_tokenizer_num_merges(const sl_tokenizer *t) { return t->n_merges; }

// ---------------------------------------------------------------- encoding

typedef struct { int32_t *p; size_t n, cap; } id_buf;

static int id_push(id_buf *b, const int32_t *ids, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + n) cap *= 2;
        int32_t *p = realloc(b->p, cap * sizeof *p);
        if (!p) return sl_errorf("out of memory growing the token id buffer to %zu ids", cap);
        b->p = p; b->cap = cap;
    }
    memcpy(b->p + b->n, ids, n * sizeof *ids);
    b->n += n;
    return 0;
}

// One encode call's cache: pre-token bytes -> the ids BPE made of them. Words repeat a lot in text,
// so most pieces are looked up rather than merged.
typedef struct { uint64_t hash; size_t key_off; uint32_t key_len; size_t ids_off; uint32_t ids_len; } cache_entry;
typedef struct {
    cache_entry *slots;  // (cap) key_len == UINT32_MAX marks empty
    size_t cap, count;
    char *keys; size_t keys_n, keys_cap;
    id_buf ids;
} word_cache;

typedef struct {
    const sl_tokenizer *tok;
    id_buf out;
    id_buf scratch;  // symbols of the word being merged
    word_cache cache;
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

// Byte-pair merging of one pre-token; appends the ids to e->scratch (which it resets first).
static int bpe_word(encoder *e, const char *p, size_t n) {
    const sl_tokenizer *t = e->tok;
    e->scratch.n = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[(unsigned char)p[i]];
        if (id_push(&e->scratch, &id, 1)) return -1;
    }
    int32_t *s = e->scratch.p;
    size_t len = e->scratch.n;
    while (len > 1) {
        int32_t best_rank = INT32_MAX, best_id = -1;
        uint64_t best_key = 0;
        for (size_t i = 0; i + 1 < len; i++) {
            uint64_t key = (uint64_t)(uint32_t)s[i] << 32 | (uint32_t)s[i + 1];
            size_t slot = merge_slot(t, key);
            if (t->merge_keys[slot] == key && t->merge_rank[slot] < best_rank) {
                best_rank = t->merge_rank[slot]; best_id = t->merge_id[slot]; best_key = key;
            }
        }
        if (best_id < 0) break;
        int32_t a = (int32_t)(best_key >> 32), b = (int32_t)(uint32_t)best_key;
        size_t w = 0;
        for (size_t i = 0; i < len;) {  // merge every occurrence, left to right
            if (i + 1 < len && s[i] == a && s[i + 1] == b) { s[w++] = best_id; i += 2; }
            else s[w++] = s[i++];
        }
        len = w;
    }
    e->scratch.n = len;
    return 0;
}

static int encode_piece(void *ctx, const char *p, size_t n) {
    encoder *e = ctx;
    word_cache *c = &e->cache;
    if ((c->count + 1) * 2 > c->cap && cache_grow(c)) return -1;
    uint64_t h = hash_bytes(p, n);
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

static int encode_special(void *ctx) {
    encoder *e = ctx;
    int32_t id = e->tok->eot_id;
    return id_push(&e->out, &id, 1);
}

static int encode_impl(const sl_tokenizer *t, const char *text, size_t len, int split_special, int32_t **ids,
                       size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    encoder e = {.tok = t};
    int rc = pretokenize_with(t->re, text, len, split_special && t->eot_id >= 0, encode_piece, encode_special, &e);
    free(e.scratch.p);
    free(e.cache.slots);
    free(e.cache.keys);
    free(e.cache.ids.p);
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
    return encode_impl(t, text, len, 1, ids, n_ids);
}

int sl_tokenizer_encode_ordinary(const sl_tokenizer *t, const char *text, size_t len, int32_t **ids,
                                 size_t *n_ids) {
    return encode_impl(t, text, len, 0, ids, n_ids);
}

// ---------------------------------------------------------------- decoding

const char *sl_tokenizer_token_bytes(const sl_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) { *len = 0; return NULL; }
    *len = t->tok_len[id];
    return t->tok_bytes[id];
}

int sl_tokenizer_decode(const sl_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len) {
    *text = NULL;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return sl_errorf("decode: id %d at position %zu is outside the vocab [0, %d)", ids[i], i, t->n_vocab);
        total += t->tok_len[ids[i]];
    }
    char *out = sl_malloc(total + 1, "decoded text");
    if (!out) return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(out + o, t->tok_bytes[ids[i]], t->tok_len[ids[i]]);
        o += t->tok_len[ids[i]];
    }
    out[o] = '\0';
    *text = out;
    if (len) *len = o;
    return 0;
}
