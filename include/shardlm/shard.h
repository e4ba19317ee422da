// shard.h: token shards in llm.c's format. A shard is a 1024-byte header of 256 little-endian int32,
// then the tokens:
//   header[0] = 20240520 (SL_SHARD_MAGIC_U16): tokens are uint16, header[1] = version 1
//   header[0] = 20240801 (SL_SHARD_MAGIC_U32): tokens are uint32, header[1] = version 7 (llm.c's
//               LLaMA-3 shards; version 1 is accepted too)
//   header[2] = number of tokens; the file is exactly 1024 + n_tokens * token_bytes long.
// Writers pick uint16 when the vocab fits (vocab_size <= 65536), else uint32, and write atomically.
// Readers check the size, magic, version, token count against the file size and, when the vocab size
// is known (> 0), every token id; each failure returns -1 with a message naming the file, what was
// expected and what was found.
#ifndef SHARDLM_SHARD_H
#define SHARDLM_SHARD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define SL_SHARD_MAGIC_U16 20240520
#define SL_SHARD_MAGIC_U32 20240801
#define SL_SHARD_VERSION_U16 1
#define SL_SHARD_VERSION_U32 7
#define SL_SHARD_HEADER_INTS 256
#define SL_SHARD_HEADER_BYTES (SL_SHARD_HEADER_INTS * 4)

typedef struct {
    char *path;        // owned copy
    FILE *f;           // open for reading
    int64_t n_tokens;  // header[2], checked against the file size
    int token_bytes;   // 2 or 4
} sl_shard;

// Writes tokens[0..n) to path (atomically). Every token must be in [0, vocab_size); vocab_size picks
// the token width (<= 65536: uint16).
int sl_shard_write(const char *path, const int32_t *tokens, size_t n, int vocab_size);

// Opens a shard and validates its header against the file size (tokens are checked as they are read).
int sl_shard_open(sl_shard *s, const char *path);
// Reads tokens [start, start + count) into out as int32; fails on a range outside the shard or, with
// vocab_size > 0, on an id >= vocab_size (naming the file and the token index).
int sl_shard_read_tokens(sl_shard *s, int64_t start, size_t count, int vocab_size, int32_t *out);
void sl_shard_close(sl_shard *s);

// Reads and validates a whole shard into a malloc'd array (*tokens, caller frees).
int sl_shard_read(const char *path, int vocab_size, int32_t **tokens, size_t *n);

#endif
