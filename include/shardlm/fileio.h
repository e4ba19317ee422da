// fileio.h: whole-file reads with clear errors, and atomic writes (temp file, fsync, rename).
#ifndef SHARDLM_FILEIO_H
#define SHARDLM_FILEIO_H

#include <stddef.h>

// Reads a whole file into a NUL-terminated malloc'd buffer; NULL + error naming the path on failure.
// Only regular files are read: a directory, FIFO or device is refused ("PATH: is a directory,
// expected a file").
char *sl_read_text_file(const char *path, size_t *len_out);

// NULL when st_mode `mode` is a regular file, else why not ("is a directory, expected a file", ...).
const char *sl_not_a_file(unsigned mode);

// Writes `len` bytes to `path` atomically: path.tmp.<pid>, fsync, rename, fsync of the directory.
int sl_write_file_atomic(const char *path, const void *data, size_t len);

// fsync a directory so a rename inside it is durable.
int sl_fsync_dir(const char *dir);

// mkdir -p
int sl_mkdirs(const char *path);

// rm -rf (without a shell); a path that does not exist is not an error.
int sl_remove_tree(const char *path);

// FNV-1a 64-bit hash of n bytes, continuing from h (start with SL_FNV1A64_INIT): for each byte,
// h ^= byte; h *= 1099511628211 (mod 2^64), from the offset basis 14695981039346656037
// (0xcbf29ce484222325), as specified by Fowler, Noll and Vo; FNV-1a("a") = 0xaf63dc4c8601ec8c.
#define SL_FNV1A64_INIT 14695981039346656037ULL
unsigned long long sl_fnv1a64(unsigned long long h, const void *data, size_t n);

#endif
