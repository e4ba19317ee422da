// args.c: flag parsing helpers (see args.h).
#include "cli/args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sl_arg_switch(sl_args *a, const char *name) { return strcmp(a->argv[a->i], name) == 0; }

int sl_arg_flag(sl_args *a, const char *name) {
    const char *arg = a->argv[a->i];
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0) return 0;
    if (arg[n] == '=') { a->value = arg + n + 1; return 1; }
    if (arg[n] != '\0') return 0;
    if (a->i + 1 >= a->argc) {
        fprintf(stderr, "error: flag %s expects a value\n", name);
        a->error = 1;
        a->value = "";
        return 1;
    }
    a->value = a->argv[++a->i];
    return 1;
}

int sl_arg_i64(sl_args *a, const char *name, int64_t *out) {
    if (!sl_arg_flag(a, name)) return 0;
    if (a->error) return 1;
    char *end;
    errno = 0;
    long long v = strtoll(a->value, &end, 10);
    if (errno || end == a->value || *end) {
        fprintf(stderr, "error: flag %s expects an integer, got '%s'\n", name, a->value);
        a->error = 1;
    } else {
        *out = v;
    }
    return 1;
}

int sl_arg_int(sl_args *a, const char *name, int *out) {
    int64_t v = *out;
    if (!sl_arg_i64(a, name, &v)) return 0;
    if (!a->error && (v < -2147483647LL || v > 2147483647LL)) {
        fprintf(stderr, "error: flag %s value %lld is out of range\n", name, (long long)v);
        a->error = 1;
    }
    *out = (int)v;
    return 1;
}

int sl_arg_float(sl_args *a, const char *name, float *out) {
    if (!sl_arg_flag(a, name)) return 0;
    if (a->error) return 1;
    char *end;
    errno = 0;
    float v = strtof(a->value, &end);
    if (errno || end == a->value || *end || !isfinite(v)) {
        fprintf(stderr, "error: flag %s expects a finite number, got '%s'\n", name, a->value);
        a->error = 1;
    } else {
        *out = v;
    }
    return 1;
}

int sl_arg_str(sl_args *a, const char *name, char *out, size_t cap) {
    if (!sl_arg_flag(a, name)) return 0;
    if (strlen(a->value) >= cap) {
        fprintf(stderr, "error: flag %s value is too long\n", name);
        a->error = 1;
        return 1;
    }
    snprintf(out, cap, "%s", a->value);
    return 1;
}
