// tokenizer_internal.h: the tokenizer's tables, shared by its loaders (tokenizer.c: GPT-2's vocab.json +
// merges.txt; tokenizer_json.c: Hugging Face's tokenizer.json) and its encoder / decoder
// (tokenizer_encode.c).
//
// One BPE engine serves both families of BPE tokenizers:
//   - byte-level (GPT-2, LLaMA 3, Qwen): a word's symbols start as its bytes; vocab and merges files
//     spell bytes with bytes_to_unicode's code points, kept here as the raw bytes;
//   - character-level with byte fallback (LLaMA 2, Mistral: SentencePiece BPE as transformers converts
//     it): a word's symbols start as its UTF-8 characters; a character not in the vocab becomes its
//     bytes' "<0xXX>" tokens (byte_fallback) or the unknown token.
// Text flows: added tokens cut out -> normalizer -> pre-tokenizer (words) -> BPE -> ids, then the
// post-processor's template ids around them (encode_special only).
#ifndef SHARDLM_TOKENIZER_INTERNAL_H
#define SHARDLM_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "shardlm/tokenizer.h"

#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

enum { TOK_BYTE_LEVEL, TOK_CHARS };

// An added token (tokenizer.json's added_tokens; GPT-2's <|endoftext|>): matched in the text before
// anything else, never split. `normalized` ones are matched in the normalized text.
typedef struct {
    char *content;
    uint32_t len;
    int32_t id;
    int special, normalized, lstrip, rstrip;
} tok_added;

enum { NORM_PREPEND, NORM_REPLACE, NORM_UNICODE };
typedef struct {
    int kind;
    int unicode;      // UNICODE: utf8proc's options for NFC / NFD / NFKC / NFKD
    char *from, *to;  // PREPEND: to = the prefix; REPLACE: from -> to (literal strings)
    size_t from_n, to_n;
} tok_norm;

enum { PRE_SPLIT, PRE_BYTE_LEVEL, PRE_METASPACE, PRE_DIGITS };
enum { SPLIT_ISOLATED, SPLIT_REMOVED, SPLIT_MERGED_PREVIOUS, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
enum { PREPEND_NEVER, PREPEND_FIRST, PREPEND_ALWAYS };
typedef struct {
    int kind;
    pcre2_code *re;       // SPLIT (a Regex or an escaped String); BYTE_LEVEL with use_regex: GPT-2's
    int behavior, invert; // SPLIT
    int add_prefix_space; // BYTE_LEVEL
    char repl[8];         // METASPACE: the replacement of ' ' (UTF-8)
    int repl_n, prepend, split;
    int individual;       // DIGITS: each digit its own word
} tok_pre;

struct sl_tokenizer {
    int kind;              // TOK_BYTE_LEVEL or TOK_CHARS
    int n_vocab;           // ids 0..n_vocab-1, each with bytes
    char **tok_bytes;      // (n_vocab) each id's lookup bytes: raw bytes (byte-level) or the token's string
    uint32_t *tok_len;
    char **dec_bytes;      // (n_vocab) what decoding writes for the id (== tok_bytes unless TOK_CHARS)
    uint32_t *dec_len;
    char *bytes_pool, *dec_pool;
    const char **tok_names; // (n_vocab) while loading: each id's vocab string (for messages)
    uint32_t *vocab_slots; // (vocab_cap) open addressing over the model vocab: id + 1, 0 = empty
    size_t vocab_cap;
    int32_t byte_id[256];  // byte-level: the one-byte token of each byte; TOK_CHARS: its <0xXX> token or -1
    int byte_fallback, unk_id, fuse_unk, ignore_merges;
    int eot_id;            // end of text / document: tokenizer_config's eos_token, else <|endoftext|>
    int bos_id;
    int n_merges;
    uint64_t *merge_keys;  // (merge_cap) (a << 32 | b), UINT64_MAX = empty
    int32_t *merge_rank;   // (merge_cap)
    int32_t *merge_id;     // (merge_cap)
    size_t merge_cap;
    pcre2_code *re;        // GPT-2's pre-tokenisation regex
    tok_added *added;      // (n_added)
    int n_added;
    unsigned char added_first[256];  // 1 for each byte an added token starts with (tok_index_added)
    tok_norm *norm;        // (n_norm) the normalizer's steps in order
    int n_norm;
    tok_pre *pre;          // (n_pre) the pre-tokenizer's steps in order
    int n_pre;
    int32_t *prefix, *suffix;  // the post-processor's ids around a single sequence
    int n_prefix, n_suffix;
    int strip_left;        // the decoder removes this many leading spaces from the decoded text
    int join_space;        // no decoder: tokens are joined with spaces (as tokenizers does)
    int first_drop_n;      // Metaspace decoder: its replacement is dropped wherever it is in the first token,
    char **first_bytes;    // (n_vocab, when first_drop_n) so a text's first token decodes to this form
    uint32_t *first_len;
};

uint64_t tok_hash_bytes(const char *p, size_t n);
size_t tok_pow2_at_least(size_t n);
int tok_vocab_find(const sl_tokenizer *t, const char *p, size_t n);
void tok_vocab_insert(sl_tokenizer *t, int id);

// The merge table's slot for key (a << 32 | b): the key's, or the empty one where it would go. Inline:
// byte-pair merging looks up every adjacent pair.
static inline size_t tok_merge_slot(const sl_tokenizer *t, uint64_t key) {
    uint64_t z = key;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    size_t mask = t->merge_cap - 1;
    size_t i = z & mask;
    while (t->merge_keys[i] != key && t->merge_keys[i] != UINT64_MAX) i = (i + 1) & mask;
    return i;
}
// Allocates the merge table for up to `n` merges (all slots empty).
int tok_merges_alloc(sl_tokenizer *t, size_t n);
// Records merge (a, b) -> m at the next rank; a merge listed again takes the later rank.
void tok_merge_add(sl_tokenizer *t, int a, int b, int m);
// Decodes a string of bytes_to_unicode code points into raw bytes (out: capacity >= n); -1 if s holds
// something else (then *bad_at / *bad_cp say where and what, -1: invalid UTF-8).
long tok_unicode_to_bytes(const char *s, size_t n, char *out, size_t *bad_at, long *bad_cp);
const char *tok_for_message(const char *s, char *buf, size_t cap);
pcre2_code *tok_compile_regex(const char *pattern, size_t len, uint32_t options, const char *what);
pcre2_code *tok_gpt2_regex(void);
void tok_init_byte_tables(void);

int tok_load_json(sl_tokenizer *t, const char *path, const char *config_path);
// Fills added_first once the added tokens are final.
void tok_index_added(sl_tokenizer *t);
// Runs the normalizer's steps over p[0, n): a malloc'd result in *out (*out_n bytes, NUL after them).
int tok_normalize(const sl_tokenizer *t, const char *p, size_t n, char **out, size_t *out_n);

#endif
