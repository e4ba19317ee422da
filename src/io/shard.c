// shard.c: writing and reading llm.c-format token shards (format in shard.h).
// Owns nothing beyond the open sl_shard. Invariants: a shard on disk is either the complete old file
// or the complete new one (atomic write); an sl_shard that opened successfully has a header whose
// magic, version and token count agree with the file's size, so every token read is in bounds.
#include "shardlm/shard.h"
#include "shardlm/error.h"
#include "shardlm/fileio.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void put_i32(unsigned char *p, int32_t v) {
    uint32_t u = (uint32_t)v;
    for (int k = 0; k < 4; k++) p[k] = (unsigned char)(u >> (8 * k));
}

static int32_t get_i32(const unsigned char *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

int sl_shard_write(const char *path, const int32_t *tokens, size_t n, int vocab_size) {
    if (vocab_size <= 0) return sl_errorf("%s: writing a shard needs the vocab size, got %d", path, vocab_size);
    if (n > INT32_MAX)
        return sl_errorf("%s: %zu tokens do not fit one shard (the header holds at most %d)", path, n, INT32_MAX);
    int tb = vocab_size <= 65536 ? 2 : 4;
    size_t bytes = SL_SHARD_HEADER_BYTES + n * (size_t)tb;
    unsigned char *buf = sl_calloc(bytes, 1, "shard buffer");
    if (!buf) return -1;
    put_i32(buf, tb == 2 ? SL_SHARD_MAGIC_U16 : SL_SHARD_MAGIC_U32);
    put_i32(buf + 4, tb == 2 ? SL_SHARD_VERSION_U16 : SL_SHARD_VERSION_U32);
    put_i32(buf + 8, (int32_t)n);
    unsigned char *p = buf + SL_SHARD_HEADER_BYTES;
    for (size_t i = 0; i < n; i++) {
        int32_t t = tokens[i];
        if (t < 0 || t >= vocab_size) {
            free(buf);
            return sl_errorf("%s: token %zu is %d, outside the vocab [0, %d)", path, i, t, vocab_size);
        }
        uint32_t u = (uint32_t)t;
        for (int k = 0; k < tb; k++) p[i * (size_t)tb + (size_t)k] = (unsigned char)(u >> (8 * k));
    }
    int rc = sl_write_file_atomic(path, buf, bytes);
    free(buf);
    return rc;
}

void sl_shard_close(sl_shard *s) {
    if (s->f) fclose(s->f);
    free(s->path);
    memset(s, 0, sizeof *s);
}

int sl_shard_open(sl_shard *s, const char *path) {
    memset(s, 0, sizeof *s);
    FILE *f = fopen(path, "rb");
    if (!f) return sl_errorf("%s: cannot open token shard: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0) { fclose(f); return sl_errorf("%s: cannot stat: %s", path, strerror(errno)); }
    if (sl_not_a_file(st.st_mode)) { fclose(f); return sl_errorf("%s: %s", path, sl_not_a_file(st.st_mode)); }
    long long size = (long long)st.st_size;
    if (size < SL_SHARD_HEADER_BYTES) {
        fclose(f);
        return sl_errorf("%s: token shard is %lld bytes, shorter than its %d-byte header", path, size,
                         SL_SHARD_HEADER_BYTES);
    }
    unsigned char h[16];
    if (fread(h, 1, sizeof h, f) != sizeof h) { fclose(f); return sl_errorf("%s: cannot read shard header", path); }
    int32_t magic = get_i32(h), version = get_i32(h + 4), count = get_i32(h + 8);
    int tb;
    if (magic == SL_SHARD_MAGIC_U16) {
        tb = 2;
        if (version != SL_SHARD_VERSION_U16) {
            fclose(f);
            return sl_errorf("%s: unknown shard version %d for magic %d (expected %d)", path, version, magic,
                             SL_SHARD_VERSION_U16);
        }
    } else if (magic == SL_SHARD_MAGIC_U32) {
        tb = 4;
        if (version != SL_SHARD_VERSION_U32 && version != 1) {
            fclose(f);
            return sl_errorf("%s: unknown shard version %d for magic %d (expected %d or 1)", path, version, magic,
                             SL_SHARD_VERSION_U32);
        }
    } else {
        fclose(f);
        return sl_errorf("%s: bad magic %d: expected %d (uint16 tokens) or %d (uint32 tokens); not a token shard?",
                         path, magic, SL_SHARD_MAGIC_U16, SL_SHARD_MAGIC_U32);
    }
    long long want = SL_SHARD_HEADER_BYTES + (long long)count * tb;
    if (count < 0 || want != size) {
        fclose(f);
        return sl_errorf("%s: header says %d tokens of %d bytes (%lld bytes in all) but the file has %lld bytes%s",
                         path, count, tb, want, size, size < want ? " (truncated?)" : "");
    }
    s->path = strdup(path);
    if (!s->path) { fclose(f); return sl_errorf("out of memory"); }
    s->f = f;
    s->n_tokens = count;
    s->token_bytes = tb;
    return 0;
}

int sl_shard_read_tokens(sl_shard *s, int64_t start, size_t count, int vocab_size, int32_t *out) {
    if (start < 0 || (uint64_t)start + count > (uint64_t)s->n_tokens)
        return sl_errorf("%s: reading tokens [%lld, %lld) but the shard has %lld", s->path, (long long)start,
                         (long long)start + (long long)count, (long long)s->n_tokens);
    long off = SL_SHARD_HEADER_BYTES + (long)start * s->token_bytes;
    if (fseek(s->f, off, SEEK_SET) != 0) return sl_errorf("%s: cannot seek to byte %ld", s->path, off);
    // Read into the tail of out (int32 is at least as wide as a stored token), then widen in place
    // from the front: element i is written to bytes [4i, 4i+4), which end before unread element i+1
    // starts (at shift + (i+1)*tb, shift = count*(4-tb)).
    unsigned char *raw = (unsigned char *)out;
    size_t bytes = count * (size_t)s->token_bytes;
    size_t shift = count * 4 - bytes;
    if (fread(raw + shift, 1, bytes, s->f) != bytes)
        return sl_errorf("%s: short read of %zu bytes at byte %ld (file changed while open?)", s->path, bytes, off);
    for (size_t i = 0; i < count; i++) {
        const unsigned char *p = raw + shift + i * (size_t)s->token_bytes;
        uint32_t v = s->token_bytes == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8
                                         : (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                                               (uint32_t)p[3] << 24;
        if ((vocab_size > 0 && v >= (uint32_t)vocab_size) || v > INT32_MAX)
            return sl_errorf("%s: token %lld is %u, expected an id below the vocab size %d", s->path,
                             (long long)start + (long long)i, v, vocab_size);
        out[i] = (int32_t)v;
    }
    return 0;
}

int sl_shard_read(const char *path, int vocab_size, int32_t **tokens, size_t *n) {
    *tokens = NULL;
    *n = 0;
    sl_shard s;
    if (sl_shard_open(&s, path) != 0) return -1;
    int32_t *buf = sl_malloc((size_t)s.n_tokens * sizeof *buf, "shard tokens");
    int rc = buf ? sl_shard_read_tokens(&s, 0, (size_t)s.n_tokens, vocab_size, buf) : -1;
    if (rc == 0) { *tokens = buf; *n = (size_t)s.n_tokens; }
    else free(buf);
    sl_shard_close(&s);
    return rc;
}
