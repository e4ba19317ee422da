// tokenizer.c: the tokenizer's tables (vocab hash map, merge table, bytes_to_unicode) and the GPT-2
// two-file loader (vocab.json + merges.txt); tokenizer.json is read by tokenizer_json.c, text is
// encoded and decoded by tokenizer_encode.c, a vocabulary trained by bpe_train.c.
// Invariants: after a successful load every id 0..n_vocab-1 has bytes; byte_id[b] is the id of the
// one-byte token b (all 256 exist); every merge (a, b) -> m satisfies bytes(m) == bytes(a) + bytes(b);
// the tokenizer is never modified after load, so encode/decode are thread-safe (each encode call
// keeps its own word cache and PCRE2 match data).
#include "io/tokenizer_internal.h"
#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/json_get.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";


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

void tok_init_byte_tables(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fill_byte_tables);
}

uint32_t sl_byte_to_unicode(uint8_t b) {
    tok_init_byte_tables();
    return byte_to_cp[b];
}

// Decodes a vocab/merges string (UTF-8 of mapped code points) into raw bytes written to out
// (capacity >= n). Returns the byte count, or -1 if s holds something that is no byte's code point:
// then *bad_at is its byte offset in s and *bad_cp the code point (-1: not valid UTF-8).
long tok_unicode_to_bytes(const char *s, size_t n, char *out, size_t *bad_at, long *bad_cp) {
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
const char *tok_for_message(const char *s, char *buf, size_t cap) {
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

uint64_t tok_hash_bytes(const char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) { h ^= (unsigned char)p[i]; h *= 0x100000001b3ULL; }
    return h ^ (h >> 29);
}


size_t tok_pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

int tok_vocab_find(const sl_tokenizer *t, const char *p, size_t n) {
    size_t mask = t->vocab_cap - 1;
    for (size_t i = tok_hash_bytes(p, n) & mask;; i = (i + 1) & mask) {
        uint32_t s = t->vocab_slots[i];
        if (s == 0) return -1;
        int id = (int)s - 1;
        if (t->tok_len[id] == n && memcmp(t->tok_bytes[id], p, n) == 0) return id;
    }
}

void tok_vocab_insert(sl_tokenizer *t, int id) {
    size_t mask = t->vocab_cap - 1;
    size_t i = tok_hash_bytes(t->tok_bytes[id], t->tok_len[id]) & mask;
    while (t->vocab_slots[i] != 0) i = (i + 1) & mask;
    t->vocab_slots[i] = (uint32_t)id + 1;
}


// ---------------------------------------------------------------- regex

pcre2_code *tok_compile_regex(const char *pattern, size_t len, uint32_t options, const char *what) {
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | options,
                                   &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        sl_errorf("compiling %s failed at offset %zu: %s", what, (size_t)off, msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // optional: pcre2_match falls back to the interpreter
    return re;
}

pcre2_code *tok_gpt2_regex(void) {
    return tok_compile_regex(GPT2_PATTERN, sizeof GPT2_PATTERN - 1, 0, "the GPT-2 pre-tokenisation regex");
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
    pcre2_code *re = tok_gpt2_regex();
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
    free(t->dec_bytes);
    free(t->dec_len);
    free(t->first_bytes);
    free(t->first_len);
    free(t->bytes_pool);
    free(t->dec_pool);
    free(t->tok_names);
    free(t->vocab_slots);
    free(t->merge_keys);
    free(t->merge_rank);
    free(t->merge_id);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    for (int i = 0; i < t->n_norm; i++) { free(t->norm[i].from); free(t->norm[i].to); }
    free(t->norm);
    for (int i = 0; i < t->n_pre; i++)
        if (t->pre[i].re && t->pre[i].re != t->re) pcre2_code_free(t->pre[i].re);
    free(t->pre);
    free(t->prefix);
    free(t->suffix);
    if (t->re) pcre2_code_free(t->re);
    free(t);
}

void tok_index_added(sl_tokenizer *t) {
    memset(t->added_first, 0, sizeof t->added_first);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len) t->added_first[(unsigned char)t->added[i].content[0]] = 1;
}

int tok_merges_alloc(sl_tokenizer *t, size_t n) {
    t->merge_cap = tok_pow2_at_least(n * 2 + 1);
    t->merge_keys = sl_malloc(t->merge_cap * sizeof(uint64_t), "merge table");
    t->merge_rank = sl_malloc(t->merge_cap * sizeof(int32_t), "merge ranks");
    t->merge_id = sl_malloc(t->merge_cap * sizeof(int32_t), "merge ids");
    if (!t->merge_keys || !t->merge_rank || !t->merge_id) return -1;
    memset(t->merge_keys, 0xFF, t->merge_cap * sizeof(uint64_t));
    return 0;
}

void tok_merge_add(sl_tokenizer *t, int a, int b, int m) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t s = tok_merge_slot(t, key);
    t->merge_keys[s] = key;  // a merge listed twice keeps its last rank, as tokenizers' map does
    t->merge_rank[s] = t->n_merges;
    t->merge_id[s] = m;
    t->n_merges++;
}

static const char *json_kind(const cJSON *v) {
    return cJSON_IsString(v) ? "a string" : cJSON_IsBool(v) ? "a boolean" : cJSON_IsNull(v) ? "null"
           : cJSON_IsArray(v) ? "an array" : cJSON_IsObject(v) ? "an object" : "a number";
}

// Checks one vocab.json entry (token string -> id of n) and decodes it into pool + *used.
static int vocab_entry(sl_tokenizer *t, const char *path, const cJSON *e, int n, size_t *used) {
    char tb[256];
    const char *tok = tok_for_message(e->string, tb, sizeof tb);
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
                         "exactly once", path, tok, id, tok_for_message(t->tok_names[id], first, sizeof first), n);
    }
    size_t at = 0;
    long cp = -1;
    long nb = tok_unicode_to_bytes(e->string, strlen(e->string), t->bytes_pool + *used, &at, &cp);
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
    t->vocab_cap = tok_pow2_at_least((size_t)n * 2);
    t->vocab_slots = sl_calloc(t->vocab_cap, sizeof(uint32_t), "vocab hash map");
    if (!t->vocab_slots) return -1;
    for (int id = 0; id < n; id++) {
        if (tok_vocab_find(t, t->tok_bytes[id], t->tok_len[id]) >= 0) {
            return sl_errorf("%s: id %d decodes to the same bytes as id %d", path, id,
                             tok_vocab_find(t, t->tok_bytes[id], t->tok_len[id]));
        }
        tok_vocab_insert(t, id);
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = tok_vocab_find(t, &c, 1);
        if (t->byte_id[b] < 0) return sl_errorf("%s: no token for byte 0x%02x; a byte-level vocab needs all 256", path, b);
    }
    t->eot_id = tok_vocab_find(t, SL_EOT_STRING, sizeof SL_EOT_STRING - 1);
    return 0;
}

static int load_merges(sl_tokenizer *t, const char *path) {
    size_t len;
    char *text = sl_read_text_file(path, &len);
    if (!text) return -1;
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    char *buf = sl_malloc(len + 1, "merge scratch");
    if (tok_merges_alloc(t, lines) || !buf) { free(text); free(buf); return -1; }
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
        long na = tok_unicode_to_bytes(p, (size_t)(sp - p), buf, NULL, NULL);
        long nb = na < 0 ? -1 : tok_unicode_to_bytes(sp + 1, n - (size_t)(sp + 1 - p), buf + na, NULL, NULL);
        if (na <= 0 || nb <= 0) {
            rc = sl_errorf("%s:%d: merge \"%.*s\" has an empty half or a character outside GPT-2's byte alphabet",
                           path, line_no, (int)n, p);
            break;
        }
        int a = tok_vocab_find(t, buf, (size_t)na), b = tok_vocab_find(t, buf + na, (size_t)nb);
        int m = tok_vocab_find(t, buf, (size_t)(na + nb));
        if (a < 0 || b < 0 || m < 0) {
            rc = sl_errorf("%s:%d: merge \"%.*s\": %s is not in the vocab", path, line_no, (int)n, p,
                           a < 0 ? "the left token" : b < 0 ? "the right token" : "the merged token");
            break;
        }
        tok_merge_add(t, a, b, m);
        p = e + 1;
    }
    free(buf);
    free(text);
    return rc;
}

// GPT-2's pipeline as tokenizer.json spells it: <|endoftext|> an added special token, the ByteLevel
// pre-tokenizer with GPT-2's regex, no normalizer, no template.
static int gpt2_pipeline(sl_tokenizer *t) {
    t->kind = TOK_BYTE_LEVEL;
    t->unk_id = t->bos_id = -1;
    t->dec_bytes = sl_malloc((size_t)t->n_vocab * sizeof(char *), "decoded tokens");
    t->dec_len = sl_malloc((size_t)t->n_vocab * sizeof(uint32_t), "decoded token lengths");
    if (!t->dec_bytes || !t->dec_len) return -1;
    memcpy(t->dec_bytes, t->tok_bytes, (size_t)t->n_vocab * sizeof(char *));  // bytes decode to themselves
    memcpy(t->dec_len, t->tok_len, (size_t)t->n_vocab * sizeof(uint32_t));
    if (!(t->re = tok_gpt2_regex())) return -1;
    t->pre = sl_calloc(1, sizeof *t->pre, "pre-tokenizer");
    if (!t->pre) return -1;
    t->pre[0] = (tok_pre){.kind = PRE_BYTE_LEVEL, .re = t->re};
    t->n_pre = 1;
    if (t->eot_id < 0) return 0;
    t->added = sl_calloc(1, sizeof *t->added, "added tokens");
    char *c = sl_malloc(sizeof SL_EOT_STRING, "added token");
    if (!t->added || !c) { free(c); return -1; }
    memcpy(c, SL_EOT_STRING, sizeof SL_EOT_STRING);
    t->added[0] = (tok_added){.content = c, .len = sizeof SL_EOT_STRING - 1, .id = t->eot_id, .special = 1};
    t->n_added = 1;
    tok_index_added(t);
    return 0;
}

int sl_tokenizer_load(sl_tokenizer **out, const char *vocab_path, const char *merges_path) {
    *out = NULL;
    tok_init_byte_tables();
    sl_tokenizer *t = sl_calloc(1, sizeof *t, "tokenizer");
    if (!t) return -1;
    if (load_vocab(t, vocab_path) != 0 || load_merges(t, merges_path) != 0 || gpt2_pipeline(t) != 0) {
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

int sl_tokenizer_load_json(sl_tokenizer **out, const char *path, const char *config_path) {
    *out = NULL;
    tok_init_byte_tables();
    sl_tokenizer *t = sl_calloc(1, sizeof *t, "tokenizer");
    if (!t) return -1;
    if (tok_load_json(t, path, config_path) != 0) {
        sl_tokenizer_free(t);
        return sl_error_context("loading tokenizer %s", path);
    }
    *out = t;
    return 0;
}

// tokenizer.json first: it describes the whole pipeline (a Qwen or LLaMA 3 directory may also hold a
// vocab.json + merges.txt whose pre-tokenisation is not GPT-2's).
int sl_tokenizer_load_dir(sl_tokenizer **out, const char *dir) {
    char v[4096], m[4096];
    snprintf(v, sizeof v, "%s/tokenizer.json", dir);
    snprintf(m, sizeof m, "%s/tokenizer_config.json", dir);
    if (file_exists(v)) return sl_tokenizer_load_json(out, v, file_exists(m) ? m : NULL);
    snprintf(v, sizeof v, "%s/vocab.json", dir);
    snprintf(m, sizeof m, "%s/merges.txt", dir);
    if (file_exists(v) && file_exists(m)) return sl_tokenizer_load(out, v, m);
    snprintf(v, sizeof v, "%s/encoder.json", dir);
    snprintf(m, sizeof m, "%s/vocab.bpe", dir);
    if (file_exists(v) && file_exists(m)) return sl_tokenizer_load(out, v, m);
    *out = NULL;
    return sl_errorf("%s: expected tokenizer.json, vocab.json + merges.txt or encoder.json + vocab.bpe in this "
                     "directory", dir);
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
int sl_tokenizer_bos_id(const sl_tokenizer *t) { return t->bos_id; }
int sl_tokenizer_num_merges(const sl_tokenizer *t) { return t->n_merges; }

