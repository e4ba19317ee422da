// error.h: how the library reports failure. Functions return 0 on success and -1 on failure,
// having called sl_errorf() with a message that says what was expected, what was found and where
// (file, tensor, byte offset, rank). The library never calls exit(); the CLI prints sl_error().
#ifndef SHARDLM_ERROR_H
#define SHARDLM_ERROR_H

#include <stddef.h>

// Sets the thread's error message (printf-style) and returns -1, so callers can write
// `return sl_errorf("%s: expected magic %d, found %d", path, want, got);`.
int sl_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// Prepends context to the current message ("loading checkpoint x: " + old message); returns -1.
int sl_error_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// The last message set on this thread ("" if none).
const char *sl_error(void);

// malloc/calloc that set an error message on failure (what for, how many bytes).
void *sl_malloc(size_t bytes, const char *what);
void *sl_calloc(size_t count, size_t size, const char *what);

#endif
