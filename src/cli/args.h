// args.h: small helpers for the subcommands' flag parsing: `--name value` and `--name=value`,
// with numbers checked so "--steps ten" is an error naming the flag, not a silent 0.
#ifndef SHARDLM_CLI_ARGS_H
#define SHARDLM_CLI_ARGS_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int argc;
    char **argv;
    int i;              // index of the current argument
    const char *value;  // the value of the flag just matched
    int error;          // set when a flag's value is missing or malformed (message printed)
} sl_args;

// True if argv[i] is `name` (taking the next argument as value) or `name=value`.
int sl_arg_flag(sl_args *a, const char *name);
// True if argv[i] is exactly the boolean switch `name`.
int sl_arg_switch(sl_args *a, const char *name);
int sl_arg_int(sl_args *a, const char *name, int *out);
int sl_arg_i64(sl_args *a, const char *name, int64_t *out);
int sl_arg_float(sl_args *a, const char *name, float *out);
int sl_arg_str(sl_args *a, const char *name, char *out, size_t cap);

#endif
