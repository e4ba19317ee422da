// tokenizer.h: BPE tokenizers. Loads GPT-2's two-file format (vocab.json / encoder.json: token string
// -> id; merges.txt / vocab.bpe: "#version: 0.2" then one merge "A B" per line, in priority order) and
// Hugging Face's tokenizer.json for BPE models (GPT-2, LLaMA 3, Qwen-style byte-level BPE; LLaMA 2 /
// Mistral SentencePiece BPE with byte fallback: tokenizer_json.c says what it reads), encodes text to
// exactly the ids Hugging Face's fast tokenizers give, decodes ids to bytes, and trains a new GPT-2
// style vocabulary (bpe_train.c).
//
// Pre-tokenisation is GPT-2's regex, run by PCRE2 with Unicode properties:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Bytes are mapped to printable code points by GPT-2's bytes_to_unicode before lookup; in memory the
// tokenizer keeps every token as its raw bytes, so decode is a concatenation.
// A loaded tokenizer is immutable: encode/decode may run concurrently from many threads.
#ifndef SHARDLM_TOKENIZER_H
#define SHARDLM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct sl_tokenizer sl_tokenizer;

#define SL_EOT_STRING "<|endoftext|>"

// Loads vocab + merges. Every id in 0..n-1 must appear exactly once in the vocab; every merge's two
// halves and their concatenation must be in the vocab. *out is NULL on failure.
int sl_tokenizer_load(sl_tokenizer **out, const char *vocab_path, const char *merges_path);
// Loads a Hugging Face tokenizer.json; config_path (may be NULL) is its tokenizer_config.json, which
// names the bos / eos tokens.
int sl_tokenizer_load_json(sl_tokenizer **out, const char *path, const char *config_path);
// Loads DIR/tokenizer.json (+ DIR/tokenizer_config.json), else DIR/vocab.json + DIR/merges.txt, else
// DIR/encoder.json + DIR/vocab.bpe.
int sl_tokenizer_load_dir(sl_tokenizer **out, const char *dir);
void sl_tokenizer_free(sl_tokenizer *tok);

// Encodes `len` bytes of UTF-8 text into a malloc'd id array (*ids, caller frees; non-NULL even when
// *n_ids is 0), as HF's tokenizer.encode(text, add_special_tokens=False): added tokens in the text
// ("<|endoftext|>", "<s>", ...) become their ids. sl_tokenizer_encode_ordinary treats the special ones
// as plain text. sl_tokenizer_encode_special is tokenizer(text) with add_special_tokens=True: the
// post-processor's template ids (LLaMA's <s>) around the text's. With a byte-level tokenizer invalid
// UTF-8 is never lost: decode(encode(x)) == x for any bytes.
int sl_tokenizer_encode(const sl_tokenizer *tok, const char *text, size_t len, int32_t **ids, size_t *n_ids);
int sl_tokenizer_encode_ordinary(const sl_tokenizer *tok, const char *text, size_t len, int32_t **ids,
                                 size_t *n_ids);
int sl_tokenizer_encode_special(const sl_tokenizer *tok, const char *text, size_t len, int32_t **ids,
                                size_t *n_ids);
// The post-processor's ids before and after a single sequence (pointers valid while tok lives);
// returns how many in all (0 for GPT-2).
int sl_tokenizer_template(const sl_tokenizer *tok, const int32_t **prefix, int *n_prefix, const int32_t **suffix,
                          int *n_suffix);

// Decodes ids into a malloc'd NUL-terminated byte string (*text, caller frees), as HF's decode with
// skip_special_tokens=False (byte fallback's and byte-level's bytes are written as they are, where HF
// would write U+FFFD for a sequence that is not UTF-8). Ids out of range fail.
int sl_tokenizer_decode(const sl_tokenizer *tok, const int32_t *ids, size_t n, char **text, size_t *len);
// The bytes one token decodes to (not NUL-terminated; valid while tok lives; "▁" as a space), NULL if id
// is out of range.
// A token may be part of a multi-byte UTF-8 character: streaming printers should write bytes as-is.
const char *sl_tokenizer_token_bytes(const sl_tokenizer *tok, int32_t id, size_t *len);

int sl_tokenizer_vocab_size(const sl_tokenizer *tok);  // number of ids (50257 for GPT-2)
// 0 when a model with vocab_size `model_vocab` and this tokenizer agree on the number of ids, or (with
// padded_ok: trained weights) the model's vocabulary is larger (padded, as many HF models; a note on
// stderr); else -1 with one error naming both sides (where each came from) and what was expected.
int sl_tokenizer_check_model_vocab(const sl_tokenizer *tok, const char *tok_where, int model_vocab,
                                   const char *model_where, int padded_ok);
// The end of a document: tokenizer_config.json's eos_token, else "<|endoftext|>"; -1 if neither.
int sl_tokenizer_eot_id(const sl_tokenizer *tok);
int sl_tokenizer_bos_id(const sl_tokenizer *tok);      // tokenizer_config.json's bos_token, else -1
int sl_tokenizer_num_merges(const sl_tokenizer *tok);

// GPT-2's bytes_to_unicode: the code point that stands for byte b in vocab/merges files.
uint32_t sl_byte_to_unicode(uint8_t b);

// Runs GPT-2's pre-tokenisation regex over text, calling piece(ctx, p, n) for each piece in order
// (the pieces tile the text exactly). With split_special != 0 the literal "<|endoftext|>" is cut out
// first and reported by special(ctx) (may be NULL) instead of being pre-tokenised.
// A non-zero return from a callback stops the scan and is returned.
typedef int (*sl_piece_fn)(void *ctx, const char *p, size_t n);
typedef int (*sl_special_fn)(void *ctx);
int sl_pretokenize(const char *text, size_t len, int split_special, sl_piece_fn piece, sl_special_fn special,
                   void *ctx);

// Trains a byte-level BPE of `vocab_size` ids (>= 257) on the texts: ids 0..255 are the bytes
// (id = byte value), then one id per merge in the order learned, and "<|endoftext|>" last.
// Ties between equally frequent pairs go to the smaller (left id, right id). Training stops early
// when no pair occurs at least twice (the vocab is then smaller). Writes OUT_DIR/vocab.json and
// OUT_DIR/merges.txt atomically (creating OUT_DIR). "<|endoftext|>" in the texts is a boundary.
// verbose != 0 prints progress to stderr.
int sl_bpe_train(const char *const *texts, const size_t *lens, size_t n_texts, int vocab_size,
                 const char *out_dir, int verbose);

#endif
