// fileio.h: whole-file reads with clear errors, and atomic writes (temp file, fsync, rename).
#ifndef SHARDLM_FILEIO_H
#define SHARDLM_FILEIO_H

#include <stddef.h>

// Reads a whole file into a NUL-terminated malloc'd buffer; NULL + error naming the path on failure.
char *sl_read_text_file(const char *path, size_t *len_out);

// Writes `len` bytes to `path` atomically: path.tmp.<pid>, fsync, rename, fsync of the directory.
int sl_write_file_atomic(const char *path, const void *data, size_t len);

// fsync a directory so a rename inside it is durable.
int sl_fsync_dir(const char *dir);

// mkdir -p
int sl_mkdirs(const char *path);

#endif
