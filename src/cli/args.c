// args.c: flag parsing helpers (see args.h).
#include "cli/args.h"

#include <errno.h>
#include <float.h>
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

// "an integer >= 0", "an integer in [0, 3]", "a finite number >= 0", "a number in (0, 1]"
static void describe_range(const sl_num_range *r, char *buf, size_t cap) {
    int bounded = r->hi < (r->integer ? (double)SL_NO_MAX : SL_FLOAT_MAX);
    const char *what = r->integer ? "an integer" : bounded ? "a number" : "a finite number";
    if (!bounded)
        snprintf(buf, cap, "%s %s %.10g", what, (r->open & SL_OPEN_LO) ? ">" : ">=", r->lo);
    else
        snprintf(buf, cap, "%s in %c%.10g, %.10g%c", what, (r->open & SL_OPEN_LO) ? '(' : '[', r->lo, r->hi,
                 (r->open & SL_OPEN_HI) ? ')' : ']');
}

int sl_parse_number(const char *flag, const char *text, const sl_num_range *r, double *out) {
    char *end;
    double v;
    errno = 0;
    if (r->integer) {
        long long i = strtoll(text, &end, 10);
        v = (double)i;
    } else {
        v = strtod(text, &end);
    }
    int ok = errno == 0 && end != text && *end == '\0' && isfinite(v) && fabs(v) <= SL_FLOAT_MAX &&
             ((r->open & SL_OPEN_LO) ? v > r->lo : v >= r->lo) && ((r->open & SL_OPEN_HI) ? v < r->hi : v <= r->hi);
    if (!ok) {
        char range[128];
        describe_range(r, range, sizeof range);
        fprintf(stderr, "error: flag %s expects %s, got '%s'\n", flag, range, text);
        return -1;
    }
    *out = v;
    return 0;
}

static int arg_number(sl_args *a, const char *name, const sl_num_range *r, double *out) {
    if (!sl_arg_flag(a, name)) return 0;
    if (!a->error && sl_parse_number(name, a->value, r, out) != 0) a->error = 1;
    return 1;
}

int sl_arg_int(sl_args *a, const char *name, int lo, int hi, int *out) {
    sl_num_range r = {lo, hi, 1, 0};
    double v;
    if (!arg_number(a, name, &r, &v)) return 0;
    if (!a->error) *out = (int)v;
    return 1;
}

int sl_arg_float(sl_args *a, const char *name, double lo, double hi, unsigned open, float *out) {
    sl_num_range r = {lo, hi, 0, open};
    double v;
    if (!arg_number(a, name, &r, &v)) return 0;
    if (!a->error && v != 0.0 && fabs(v) < FLT_MIN) {  // it would become 0 (or a denormal) in a float
        fprintf(stderr, "error: flag %s value '%s' is outside float32's range (magnitude %.2g to %.2g, or 0)\n", name,
                a->value, (double)FLT_MIN, (double)FLT_MAX);
        a->error = 1;
    }
    if (!a->error) *out = (float)v;
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
