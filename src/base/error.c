// error.c: the thread-local error message behind sl_errorf / sl_error, and checked allocation.
#include "shardlm/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char error_message[2048];

int sl_errorf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_message, sizeof error_message, fmt, ap);
    va_end(ap);
    return -1;
}

int sl_error_context(const char *fmt, ...) {
    char prefix[1024];
    char old[sizeof error_message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, error_message, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof error_message - 3) n = sizeof error_message - 3;
    memcpy(error_message, prefix, n);
    memcpy(error_message + n, ": ", 2);
    size_t room = sizeof error_message - n - 3;
    size_t m = strnlen(old, room);
    memcpy(error_message + n + 2, old, m);
    error_message[n + 2 + m] = '\0';
    return -1;
}

const char *sl_error(void) { return error_message; }

void *sl_malloc(size_t bytes, const char *what) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) sl_errorf("out of memory allocating %zu bytes for %s", bytes, what);
    return p;
}

void *sl_calloc(size_t count, size_t size, const char *what) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) sl_errorf("out of memory allocating %zu x %zu bytes for %s", count, size, what);
    return p;
}
