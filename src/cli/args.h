// args.h: small helpers for the subcommands' flag parsing: `--name value` and `--name=value`.
// Every numeric flag of every subcommand is read through one function (sl_parse_number) that takes
// the flag's allowed range, the same limits the JSON configuration applies to the setting: a value
// that is malformed, not finite or outside the range is an error naming the flag and the range, e.g.
//   error: flag --steps expects an integer >= 0, got '-5'
// never a silent default.
#ifndef SHARDLM_CLI_ARGS_H
#define SHARDLM_CLI_ARGS_H

#include <limits.h>
#include <stddef.h>

typedef struct {
    int argc;
    char **argv;
    int i;              // index of the current argument
    const char *value;  // the value of the flag just matched
    int error;          // set when a flag's value is missing or malformed (message printed)
} sl_args;

// The values a numeric flag allows: an integer or a finite real in [lo, hi], where SL_OPEN_LO /
// SL_OPEN_HI in `open` exclude an end. hi = SL_NO_MAX (an integer) or SL_FLOAT_MAX (a real) means
// "no upper limit" in messages.
typedef struct {
    double lo, hi;
    int integer;
    unsigned open;
} sl_num_range;
#define SL_OPEN_LO 1u
#define SL_OPEN_HI 2u
#define SL_NO_MAX INT_MAX
#define SL_FLOAT_MAX 3.0e38  // the JSON reader's bound on a finite number (sl_json_get_float)

// Parses `text`, the value of flag `flag`, within r. Returns 0 with *out set, or -1 after printing
// "error: flag FLAG expects RANGE, got 'TEXT'" to stderr.
int sl_parse_number(const char *flag, const char *text, const sl_num_range *r, double *out);

// True if argv[i] is `name` (taking the next argument as value) or `name=value`.
int sl_arg_flag(sl_args *a, const char *name);
// True if argv[i] is exactly the boolean switch `name`.
int sl_arg_switch(sl_args *a, const char *name);
// Numeric flags through sl_parse_number: an integer in [lo, hi]; a real in [lo, hi] with `open`
// ends excluded. On a bad value *out is untouched and a->error is set.
int sl_arg_int(sl_args *a, const char *name, int lo, int hi, int *out);
int sl_arg_float(sl_args *a, const char *name, double lo, double hi, unsigned open, float *out);
int sl_arg_str(sl_args *a, const char *name, char *out, size_t cap);

#endif
