// prepare.c: `shardlm prepare`: text files -> token shards (+ the tokenizer they were made with).
// Owns the document list, the split into train/val, and the output directory layout:
//   OUT/train_000000.bin ...   OUT/val_000000.bin ...   (llm.c shards, see shard.h)
//   OUT/tokenizer/vocab.json + merges.txt, or tokenizer.json (+ tokenizer_config.json)
//                                                         (the tokenizer used, copied or trained)
//   OUT/prepare.json                                      (what was done: inputs, counts, shard names)
// Invariants: one input file is one document and every document is preceded by <|endoftext|>; the
// documents are taken in sorted file-name order and the val documents are chosen by index alone, so the
// same input and flags always give byte-identical shards; every file is written atomically.
#include "cli/args.h"
#include "cli/commands.h"
#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/shard.h"
#include "shardlm/tokenizer.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    const char *input, *output, *tokenizer_dir, *vocab, *merges;
    long train_vocab;     // 0: use an existing tokenizer
    double val_fraction;
    long long shard_tokens;
} prepare_args;

static void usage(FILE *f) {
    fprintf(f,
            "usage: shardlm prepare [flags]\n"
            "Tokenizes text files (one file = one document, each preceded by <|endoftext|>) into token shards.\n"
            "  --input PATH            a text file or a directory of .txt files (default ../shared/data/sotu)\n"
            "  --output DIR            where shards go (default data/sotu): DIR/train_000000.bin, DIR/val_000000.bin,\n"
            "                          DIR/tokenizer/{vocab.json,merges.txt}, DIR/prepare.json\n"
            "  --tokenizer DIR         a Hugging Face tokenizer.json (+ tokenizer_config.json), or GPT-2's\n"
            "                          vocab.json+merges.txt or encoder.json+vocab.bpe (e.g. a model directory)\n"
            "                          (default ../shared/data/gpt2)\n"
            "  --vocab F --merges F    tokenizer files given one by one\n"
            "  --train-tokenizer N     first train a byte-level BPE of N tokens on the input, into DIR/tokenizer\n"
            "  --val-fraction F        fraction of documents held out for validation (default 0.05; at least one\n"
            "                          document when F > 0; a single document is split by tokens instead; 0: none)\n"
            "  --shard-tokens N        tokens per shard file (default 100000000)\n"
            "  --help                  this text\n");
}

static int parse_args(int argc, char **argv, prepare_args *a) {
    *a = (prepare_args){"../shared/data/sotu", "data/sotu", NULL, NULL, NULL, 0, 0.05, 100000000LL};
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = NULL;
        char name[64];
        const char *eq = strchr(arg, '=');
        if (strncmp(arg, "--", 2) == 0 && eq && (size_t)(eq - arg) < sizeof name) {
            snprintf(name, sizeof name, "%.*s", (int)(eq - arg), arg);
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", arg);
        }
        if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) { usage(stdout); return 1; }
        int known = !strcmp(name, "--input") || !strcmp(name, "--output") || !strcmp(name, "--tokenizer") ||
                    !strcmp(name, "--vocab") || !strcmp(name, "--merges") || !strcmp(name, "--train-tokenizer") ||
                    !strcmp(name, "--val-fraction") || !strcmp(name, "--shard-tokens");
        if (!known) {
            fprintf(stderr, "shardlm prepare: unknown argument \"%s\"\n", arg);
            usage(stderr);
            return 2;
        }
        if (!val) {
            if (i + 1 >= argc) { fprintf(stderr, "shardlm prepare: %s needs a value\n", name); return 2; }
            val = argv[++i];
        }
        if (!strcmp(name, "--input")) a->input = val;
        else if (!strcmp(name, "--output")) a->output = val;
        else if (!strcmp(name, "--tokenizer")) a->tokenizer_dir = val;
        else if (!strcmp(name, "--vocab")) a->vocab = val;
        else if (!strcmp(name, "--merges")) a->merges = val;
        else {
            // the numeric flags, through the CLI's one number reader (cli/args.h)
            static const sl_num_range vocab = {257, 1000000, 1, 0}, frac = {0, 1, 0, SL_OPEN_HI}, shard = {1, INT32_MAX, 1, 0};
            int is_vocab = !strcmp(name, "--train-tokenizer"), is_frac = !strcmp(name, "--val-fraction");
            double v;
            if (sl_parse_number(name, val, is_vocab ? &vocab : is_frac ? &frac : &shard, &v) != 0) return 2;
            if (is_vocab) a->train_vocab = (long)v;
            else if (is_frac) a->val_fraction = v;
            else a->shard_tokens = (long long)v;
        }
    }
    if ((a->vocab != NULL) != (a->merges != NULL)) {
        fprintf(stderr, "shardlm prepare: --vocab and --merges go together\n");
        return 2;
    }
    if (a->train_vocab && (a->vocab || a->tokenizer_dir)) {
        fprintf(stderr, "shardlm prepare: --train-tokenizer makes a new tokenizer; drop --tokenizer/--vocab/--merges\n");
        return 2;
    }
    if (!a->vocab && !a->tokenizer_dir) a->tokenizer_dir = "../shared/data/gpt2";
    return 0;
}

// ---------------------------------------------------------------- documents

typedef struct { char **paths; char **texts; size_t *lens; size_t n; } doc_set;

static void docs_free(doc_set *d) {
    for (size_t i = 0; i < d->n; i++) { free(d->paths[i]); if (d->texts) free(d->texts[i]); }
    free(d->paths); free(d->texts); free(d->lens);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int list_docs(const char *input, doc_set *d) {
    struct stat st;
    if (stat(input, &st) != 0) return sl_errorf("%s: cannot read input: %s", input, strerror(errno));
    if (S_ISREG(st.st_mode)) {
        d->paths = malloc(sizeof(char *));
        if (!d->paths || !(d->paths[0] = strdup(input))) return sl_errorf("out of memory");
        d->n = 1;
        return 0;
    }
    if (!S_ISDIR(st.st_mode)) return sl_errorf("%s: expected a text file or a directory of .txt files", input);
    DIR *dir = opendir(input);
    if (!dir) return sl_errorf("%s: cannot open directory: %s", input, strerror(errno));
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        size_t nl = strlen(e->d_name);
        if (nl < 5 || strcmp(e->d_name + nl - 4, ".txt") != 0 || e->d_name[0] == '.') continue;
        if (d->n == cap) {
            cap = cap ? cap * 2 : 256;
            char **p = realloc(d->paths, cap * sizeof *p);
            if (!p) { closedir(dir); return sl_errorf("out of memory"); }
            d->paths = p;
        }
        size_t pl = strlen(input) + nl + 2;
        char *path = malloc(pl);
        if (!path) { closedir(dir); return sl_errorf("out of memory"); }
        snprintf(path, pl, "%s/%s", input, e->d_name);
        struct stat es;  // skip sub-directories; anything else unreadable fails loudly when read
        if (stat(path, &es) == 0 && S_ISDIR(es.st_mode)) { free(path); continue; }
        d->paths[d->n++] = path;
    }
    closedir(dir);
    if (d->n == 0) return sl_errorf("%s: no .txt files in this directory", input);
    qsort(d->paths, d->n, sizeof *d->paths, cmp_str);
    return 0;
}

static int read_docs(doc_set *d) {
    d->texts = calloc(d->n, sizeof *d->texts);
    d->lens = calloc(d->n, sizeof *d->lens);
    if (!d->texts || !d->lens) return sl_errorf("out of memory");
    for (size_t i = 0; i < d->n; i++) {
        d->texts[i] = sl_read_text_file(d->paths[i], &d->lens[i]);
        if (!d->texts[i]) return -1;
    }
    return 0;
}

// ---------------------------------------------------------------- output

typedef struct { int32_t *p; size_t n, cap; } stream;

static int stream_push(stream *s, const int32_t *ids, size_t n) {
    if (s->n + n > s->cap) {
        size_t cap = s->cap ? s->cap : 1 << 20;
        while (cap < s->n + n) cap *= 2;
        int32_t *p = realloc(s->p, cap * sizeof *p);
        if (!p) return sl_errorf("out of memory holding %zu tokens", cap);
        s->p = p; s->cap = cap;
    }
    memcpy(s->p + s->n, ids, n * sizeof *ids);
    s->n += n;
    return 0;
}

static int copy_file(const char *from, const char *to) {
    size_t len;
    char *data = sl_read_text_file(from, &len);
    if (!data) return -1;
    int rc = sl_write_file_atomic(to, data, len);
    free(data);
    return rc;
}

// OUT/tokenizer holds one tokenizer: files of the other kind a previous run left there would be read
// instead (tokenizer.json comes first) or beside it.
static void drop_stale_tokenizer(const char *tok_dir, int json, int has_cfg) {
    const char *stale[3];
    int n = 0;
    if (json) {
        stale[n++] = "vocab.json";
        stale[n++] = "merges.txt";
        if (!has_cfg) stale[n++] = "tokenizer_config.json";
    } else {
        stale[n++] = "tokenizer.json";
        stale[n++] = "tokenizer_config.json";
    }
    char p[4200];
    for (int i = 0; i < n; i++) {
        snprintf(p, sizeof p, "%s/%s", tok_dir, stale[i]);
        (void)unlink(p);
    }
}

// Writes SPLIT_000000.bin ... and records their names in `names`; then removes older shards of this
// split with higher numbers (left by a previous run), so the loader's glob sees only this run.
static int write_split(const char *out, const char *split, const stream *s, long long per_shard, int vocab,
                       cJSON *names) {
    size_t n_shards = s->n == 0 ? 0 : (s->n + (size_t)per_shard - 1) / (size_t)per_shard;
    char path[4096];
    for (size_t k = 0; k < n_shards; k++) {
        size_t start = k * (size_t)per_shard, n = s->n - start < (size_t)per_shard ? s->n - start : (size_t)per_shard;
        snprintf(path, sizeof path, "%s/%s_%06zu.bin", out, split, k);
        if (sl_shard_write(path, s->p + start, n, vocab) != 0) return -1;
        printf("  wrote %s (%zu tokens)\n", path, n);
        cJSON_AddItemToArray(names, cJSON_CreateString(path + strlen(out) + 1));
    }
    for (size_t k = n_shards;; k++) {
        snprintf(path, sizeof path, "%s/%s_%06zu.bin", out, split, k);
        if (unlink(path) != 0) break;
        printf("  removed stale %s from an earlier run\n", path);
    }
    return 0;
}

static int run(const prepare_args *a) {
    doc_set docs = {0};
    sl_tokenizer *tok = NULL;
    stream train = {0}, val = {0};
    int32_t **ids = NULL;
    size_t *n_ids = NULL;
    cJSON *meta = NULL;
    int rc = -1;
    char tok_dir[3072], vpath[4096], mpath[4096];
    if (strlen(a->output) > 2048) { fprintf(stderr, "shardlm prepare: --output path is too long\n"); return 1; }
    snprintf(tok_dir, sizeof tok_dir, "%s/tokenizer", a->output);
    snprintf(vpath, sizeof vpath, "%s/vocab.json", tok_dir);
    snprintf(mpath, sizeof mpath, "%s/merges.txt", tok_dir);

    if (list_docs(a->input, &docs) != 0 || read_docs(&docs) != 0) goto done;
    size_t total_bytes = 0;
    for (size_t i = 0; i < docs.n; i++) total_bytes += docs.lens[i];
    printf("prepare: %zu document(s), %zu bytes from %s\n", docs.n, total_bytes, a->input);

    if (a->train_vocab) {
        printf("prepare: training a %ld-token byte-level BPE into %s\n", a->train_vocab, tok_dir);
        if (sl_bpe_train((const char *const *)docs.texts, docs.lens, docs.n, (int)a->train_vocab, tok_dir, 1) != 0)
            goto done;
        drop_stale_tokenizer(tok_dir, 0, 0);
        if (sl_tokenizer_load(&tok, vpath, mpath) != 0) goto done;
    } else {
        if (a->vocab) rc = sl_tokenizer_load(&tok, a->vocab, a->merges);
        else rc = sl_tokenizer_load_dir(&tok, a->tokenizer_dir);
        if (rc != 0) goto done;
        rc = -1;
        char src_v[4096], src_m[4096];
        if (a->vocab) { snprintf(src_v, sizeof src_v, "%s", a->vocab); snprintf(src_m, sizeof src_m, "%s", a->merges); }
        else {
            snprintf(src_v, sizeof src_v, "%s/vocab.json", a->tokenizer_dir);
            snprintf(src_m, sizeof src_m, "%s/merges.txt", a->tokenizer_dir);
            if (access(src_v, R_OK) != 0 || access(src_m, R_OK) != 0) {
                snprintf(src_v, sizeof src_v, "%s/encoder.json", a->tokenizer_dir);
                snprintf(src_m, sizeof src_m, "%s/vocab.bpe", a->tokenizer_dir);
            }
        }
        char src_j[4096], src_c[4096];  // a tokenizer.json is what sl_tokenizer_load_dir read, if there is one
        snprintf(src_j, sizeof src_j, "%s/tokenizer.json", a->tokenizer_dir);
        snprintf(src_c, sizeof src_c, "%s/tokenizer_config.json", a->tokenizer_dir);
        int json = !a->vocab && access(src_j, R_OK) == 0, has_cfg = json && access(src_c, R_OK) == 0;
        if (json) {
            snprintf(src_v, sizeof src_v, "%s", src_j);
            snprintf(src_m, sizeof src_m, "%s", has_cfg ? src_c : "(no tokenizer_config.json)");
            snprintf(vpath, sizeof vpath, "%s/tokenizer.json", tok_dir);
            snprintf(mpath, sizeof mpath, "%s/tokenizer_config.json", tok_dir);
        }
        if (sl_mkdirs(tok_dir) != 0) goto done;
        struct stat s1, s2;  // copying a file onto itself (OUT/tokenizer given as --tokenizer) is a no-op
        int same = stat(src_v, &s1) == 0 && stat(vpath, &s2) == 0 && s1.st_ino == s2.st_ino && s1.st_dev == s2.st_dev;
        if (!same && (copy_file(src_v, vpath) != 0 || ((!json || has_cfg) && copy_file(src_m, mpath) != 0))) goto done;
        if (!same) drop_stale_tokenizer(tok_dir, json, has_cfg);
        printf("prepare: tokenizer %s + %s (%d tokens) copied to %s\n", src_v, src_m, sl_tokenizer_vocab_size(tok),
               tok_dir);
    }
    int vocab = sl_tokenizer_vocab_size(tok), eot = sl_tokenizer_eot_id(tok);
    if (eot < 0) {
        sl_errorf("%s: tokenizer has no end-of-text token to separate documents (expected <|endoftext|> or "
                  "tokenizer_config.json's eos_token)", tok_dir);
        goto done;
    }

    ids = calloc(docs.n, sizeof *ids);
    n_ids = calloc(docs.n, sizeof *n_ids);
    if (!ids || !n_ids) { sl_errorf("out of memory"); goto done; }
    int failed = 0;
    char fail_msg[2048] = "";
    #pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < docs.n; i++) {
        if (sl_tokenizer_encode_special(tok, docs.texts[i], docs.lens[i], &ids[i], &n_ids[i]) != 0) {
            #pragma omp critical
            {
                if (!failed) snprintf(fail_msg, sizeof fail_msg, "%s: %s", docs.paths[i], sl_error());
                failed = 1;
            }
        }
    }
    if (failed) { sl_errorf("%s", fail_msg); goto done; }

    // Val documents: n_val of them, spread evenly over the sorted list (by index only).
    size_t n_val = 0, val_docs = 0, train_docs = 0;
    if (a->val_fraction > 0 && docs.n > 1) {
        n_val = (size_t)llround(a->val_fraction * (double)docs.n);
        if (n_val < 1) n_val = 1;
        if (n_val > docs.n - 1) n_val = docs.n - 1;
    }
    for (size_t i = 0; i < docs.n; i++) {
        int is_val = n_val && (i + 1) * n_val / docs.n > i * n_val / docs.n;
        size_t cut = n_ids[i];  // a lone document is split by tokens: its tail is the val set
        if (docs.n == 1 && a->val_fraction > 0) cut = n_ids[i] - (size_t)ceil(a->val_fraction * (double)n_ids[i]);
        stream *s = is_val ? &val : &train;
        if (stream_push(s, &eot, 1) != 0 || stream_push(s, ids[i], cut) != 0) goto done;
        if (cut < n_ids[i] && (stream_push(&val, &eot, 1) != 0 || stream_push(&val, ids[i] + cut, n_ids[i] - cut) != 0))
            goto done;
        if (is_val) val_docs++; else train_docs++;
    }
    if (docs.n == 1 && a->val_fraction > 0) val_docs = 1;

    meta = cJSON_CreateObject();
    cJSON *train_names = cJSON_CreateArray(), *val_names = cJSON_CreateArray();
    cJSON_AddStringToObject(meta, "input", a->input);
    cJSON_AddStringToObject(meta, "tokenizer", "tokenizer");
    cJSON_AddStringToObject(meta, "tokenizer_source", a->train_vocab ? "trained" : a->vocab ? a->vocab : a->tokenizer_dir);
    cJSON_AddNumberToObject(meta, "vocab_size", vocab);
    cJSON_AddNumberToObject(meta, "eot_id", eot);
    cJSON_AddNumberToObject(meta, "documents", (double)docs.n);
    cJSON_AddNumberToObject(meta, "train_documents", (double)train_docs);
    cJSON_AddNumberToObject(meta, "val_documents", (double)val_docs);
    cJSON_AddNumberToObject(meta, "train_tokens", (double)train.n);
    cJSON_AddNumberToObject(meta, "val_tokens", (double)val.n);
    cJSON_AddNumberToObject(meta, "shard_tokens", (double)a->shard_tokens);
    cJSON_AddItemToObject(meta, "train_shards", train_names);
    cJSON_AddItemToObject(meta, "val_shards", val_names);
    if (write_split(a->output, "train", &train, a->shard_tokens, vocab, train_names) != 0) goto done;
    if (write_split(a->output, "val", &val, a->shard_tokens, vocab, val_names) != 0) goto done;
    char *json = cJSON_Print(meta);
    char mp[4096];
    snprintf(mp, sizeof mp, "%s/prepare.json", a->output);
    int wrc = json ? sl_write_file_atomic(mp, json, strlen(json)) : sl_errorf("out of memory");
    free(json);
    if (wrc != 0) goto done;
    printf("prepare: train %zu documents, %zu tokens; val %zu documents, %zu tokens; vocab %d (%s tokens); "
           "wrote %s\n", train_docs, train.n, val_docs, val.n, vocab, vocab <= 65536 ? "uint16" : "uint32", mp);
    rc = 0;
done:
    if (rc != 0) fprintf(stderr, "shardlm prepare: %s\n", sl_error());
    for (size_t i = 0; ids && i < docs.n; i++) free(ids[i]);
    free(ids); free(n_ids); free(train.p); free(val.p);
    cJSON_Delete(meta);
    sl_tokenizer_free(tok);
    docs_free(&docs);
    return rc == 0 ? 0 : 1;
}

int cmd_prepare(int argc, char **argv) {
    prepare_args a;
    int prc = parse_args(argc, argv, &a);
    if (prc == 1) return 0;  // --help
    if (prc != 0) return prc;
    return run(&a);
}
