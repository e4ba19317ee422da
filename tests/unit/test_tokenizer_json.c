// test_tokenizer_json.c: Hugging Face tokenizer.json files (GPT-2, LLaMA 3 byte-level BPE; LLaMA 2
// SentencePiece BPE with the Prepend normalizer or the Metaspace pre-tokenizer; Qwen 2 with NFC, NFKC,
// NFD; small hand-made files for single rules) against the ids, templates and decoded text the
// `tokenizers` library gives for them (fixtures made by
// tests/reference/make_tokenizer_json_fixtures.py), and the errors for what is not supported.
#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/json_get.h"
#include "shardlm/tokenizer.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#define FIX_DIR "tests/fixtures/tokenizer_json"

static const char *const LAYOUTS[] = {"bytelevel-gpt2", "bytelevel-llama3", "spm-llama2",    "metaspace-llama",
                                      "metaspace-split", "bytelevel-qwen2",  "bytelevel-nfkc", "bytelevel-nfd"};
enum { N_LAYOUTS = 8 };

static sl_tokenizer *load_layout(const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, FIX_DIR "/%s", name);
    sl_tokenizer *tok = NULL;
    if (sl_tokenizer_load_dir(&tok, dir) != 0) fprintf(stderr, "  %s: %s\n", name, sl_error());
    return tok;
}

static int ids_equal(const int32_t *ids, size_t n, const cJSON *want) {
    if (!cJSON_IsArray(want) || (size_t)cJSON_GetArraySize(want) != n) return 0;
    size_t i = 0;
    for (const cJSON *v = want->child; v; v = v->next, i++)
        if (v->valueint != ids[i]) return 0;
    return 1;
}

static void print_ids(const char *what, const int32_t *ids, size_t n) {
    fprintf(stderr, "    %s:", what);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

static int decoded_equal(const sl_tokenizer *tok, const int32_t *ids, size_t n, const cJSON *want) {
    char *text = NULL;
    size_t len = 0;
    if (sl_tokenizer_decode(tok, ids, n, &text, &len) != 0) return 0;
    int ok = cJSON_IsString(want) && strlen(want->valuestring) == len && memcmp(text, want->valuestring, len) == 0;
    if (!ok) fprintf(stderr, "    decoded \"%.80s\"\n    expected \"%.80s\"\n", text, cJSON_IsString(want) ? want->valuestring : "?");
    free(text);
    return ok;
}

// Every case: encode (added tokens recognised), encode_special (the template), decode of both.
static int check_cases(const char *name, sl_tokenizer *tok) {
    char path[512];
    snprintf(path, sizeof path, FIX_DIR "/%s/cases.json", name);
    cJSON *cases = sl_json_read_strict(path);
    CHECK_MSG(cJSON_IsArray(cases), "%s: %s", path, sl_error());
    int n_cases = 0, bad = 0;
    for (const cJSON *c = cases ? cases->child : NULL; c; c = c->next, n_cases++) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        int32_t *ids = NULL, *ids_sp = NULL;
        size_t n = 0, n_sp = 0;
        int ok = sl_tokenizer_encode(tok, text, strlen(text), &ids, &n) == 0 &&
                 sl_tokenizer_encode_special(tok, text, strlen(text), &ids_sp, &n_sp) == 0;
        int enc = ok && ids_equal(ids, n, cJSON_GetObjectItem(c, "ids"));
        int enc_sp = ok && ids_equal(ids_sp, n_sp, cJSON_GetObjectItem(c, "ids_special"));
        int dec = enc && decoded_equal(tok, ids, n, cJSON_GetObjectItem(c, "decoded"));
        int dec_sp = enc_sp && decoded_equal(tok, ids_sp, n_sp, cJSON_GetObjectItem(c, "decoded_special"));
        if (!(enc && enc_sp && dec && dec_sp)) {
            bad++;
            fprintf(stderr, "  %s case %d \"%.60s\": encode %s, template %s, decode %s / %s\n", name, n_cases, text,
                    enc ? "ok" : "DIFFERS", enc_sp ? "ok" : "DIFFERS", dec ? "ok" : "DIFFERS", dec_sp ? "ok" : "DIFFERS");
            if (!enc && ok) print_ids("got", ids, n);
        }
        free(ids);
        free(ids_sp);
    }
    cJSON_Delete(cases);
    CHECK_MSG(bad == 0, "%s: %d of %d cases differ from tokenizers", name, bad, n_cases);
    CHECK(n_cases >= 50);
    return n_cases;
}

// corpus.txt: NAME N_IDS FNV1A64 FIRST64 for whole State of the Union files.
static void check_corpus(const char *name, sl_tokenizer *tok, size_t *bytes, double *seconds) {
    char path[512];
    snprintf(path, sizeof path, FIX_DIR "/%s/corpus.txt", name);
    FILE *f = fopen(path, "r");
    CHECK_MSG(f != NULL, "cannot open %s", path);
    if (!f) return;
    char line[8192], file[256], hex[32];
    int files = 0;
    while (fgets(line, sizeof line, f)) {
        size_t want_n;
        if (sscanf(line, "%255s %zu %31s", file, &want_n, hex) != 3) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/sotu/%s", test_data_dir(), file);
        size_t len;
        char *text = sl_read_text_file(p, &len);
        CHECK_MSG(text != NULL, "%s", sl_error());
        if (!text) continue;
        int32_t *ids = NULL;
        size_t n = 0;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        CHECK(sl_tokenizer_encode(tok, text, len, &ids, &n) == 0);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        *seconds += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        *bytes += len;
        char got[32];
        snprintf(got, sizeof got, "%016llx", (unsigned long long)test_fnv1a_ids(ids, n));
        CHECK_MSG(n == want_n && strcmp(got, hex) == 0, "%s %s: %zu ids (hash %s), expected %zu (%s)", name, file, n,
                  got, want_n, hex);
        char *back = NULL;
        size_t bl = 0;
        if (strncmp(name, "bytelevel", 9) == 0) {  // byte-level: the text comes back byte for byte
            CHECK(sl_tokenizer_decode(tok, ids, n, &back, &bl) == 0);
            CHECK_MSG(back && bl == len && memcmp(back, text, len) == 0, "%s %s: decode(encode(x)) != x", name, file);
        }
        free(back);
        free(ids);
        free(text);
        files++;
    }
    fclose(f);
    CHECK(files == 12);
}

TEST(every_layout_matches_tokenizers_on_cases_and_corpus) {
    for (int i = 0; i < N_LAYOUTS; i++) {
        sl_tokenizer *tok = load_layout(LAYOUTS[i]);
        CHECK_MSG(tok != NULL, "%s did not load", LAYOUTS[i]);
        if (!tok) continue;
        CHECK(sl_tokenizer_vocab_size(tok) == 1000);
        int n = check_cases(LAYOUTS[i], tok);
        size_t bytes = 0;
        double s = 0;
        check_corpus(LAYOUTS[i], tok, &bytes, &s);
        fprintf(stderr, "  %-16s %d cases; corpus %zu bytes encoded at %.1f MB/s\n", LAYOUTS[i], n, bytes,
                bytes / 1e6 / (s > 0 ? s : 1));
        sl_tokenizer_free(tok);
    }
}

TEST(special_token_ids_and_templates) {
    struct { const char *name; int bos, eot, n_prefix, first; } want[] = {
        {"bytelevel-gpt2", 999, 999, 0, -1},
        {"bytelevel-llama3", 997, 998, 1, 997},
        {"spm-llama2", 1, 2, 1, 1},
        {"metaspace-llama", 1, 2, 1, 1},
    };
    for (int i = 0; i < 4; i++) {
        sl_tokenizer *tok = load_layout(want[i].name);
        if (!tok) { CHECK(tok != NULL); continue; }
        const int32_t *pre, *suf;
        int np, ns;
        sl_tokenizer_template(tok, &pre, &np, &suf, &ns);
        CHECK_MSG(sl_tokenizer_bos_id(tok) == want[i].bos && sl_tokenizer_eot_id(tok) == want[i].eot,
                  "%s: bos %d eot %d", want[i].name, sl_tokenizer_bos_id(tok), sl_tokenizer_eot_id(tok));
        CHECK(np == want[i].n_prefix && ns == 0);
        CHECK(np == 0 || pre[0] == want[i].first);
        sl_tokenizer_free(tok);
    }
}

// GPT-2's two files and its tokenizer.json are one tokenizer: the same ids for every case.
TEST(gpt2_two_files_equal_its_tokenizer_json) {
    sl_tokenizer *json = load_layout("bytelevel-gpt2"), *two = NULL;
    CHECK(sl_tokenizer_load(&two, FIX_DIR "/bytelevel-gpt2/vocab.json", FIX_DIR "/bytelevel-gpt2/merges.txt") == 0);
    cJSON *cases = sl_json_read_strict(FIX_DIR "/bytelevel-gpt2/cases.json");
    int same = 0, n_cases = 0;
    for (const cJSON *c = cases && json && two ? cases->child : NULL; c; c = c->next, n_cases++) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        int32_t *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        if (sl_tokenizer_encode(json, text, strlen(text), &a, &na) == 0 &&
            sl_tokenizer_encode(two, text, strlen(text), &b, &nb) == 0)
            same += na == nb && memcmp(a, b, na * sizeof *a) == 0;
        free(a);
        free(b);
    }
    CHECK(n_cases > 0 && same == n_cases);
    cJSON_Delete(cases);
    sl_tokenizer_free(json);
    sl_tokenizer_free(two);
}

// edges.json: small hand-made tokenizers, each pinning one rule (the generator says which), with what
// tokenizers gives for encode, encode with special tokens left as text, the template and decode.
TEST(edge_rules_match_tokenizers) {
    cJSON *edges = sl_json_read_strict(FIX_DIR "/edges.json");
    CHECK_MSG(cJSON_IsArray(edges), "%s", sl_error());
    char dir[] = "/tmp/shardlm_test_tokedge_XXXXXX", path[64];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    int n_edges = 0;
    for (const cJSON *ed = edges ? edges->child : NULL; ed; ed = ed->next, n_edges++) {
        const char *name = cJSON_GetObjectItem(ed, "name")->valuestring;
        char *text = cJSON_PrintUnformatted(cJSON_GetObjectItem(ed, "tokenizer"));
        FILE *f = fopen(path, "wb");
        if (f) { fputs(text, f); fclose(f); }
        free(text);
        sl_tokenizer *tok = NULL;
        CHECK_MSG(sl_tokenizer_load_json(&tok, path, NULL) == 0, "%s: %s", name, sl_error());
        if (!tok) continue;
        for (const cJSON *c = cJSON_GetObjectItem(ed, "cases")->child; c; c = c->next) {
            const char *t = cJSON_GetObjectItem(c, "text")->valuestring;
            int32_t *a = NULL, *o = NULL, *sp = NULL;
            size_t na = 0, no = 0, ns = 0;
            int ok = sl_tokenizer_encode(tok, t, strlen(t), &a, &na) == 0 &&
                     sl_tokenizer_encode_ordinary(tok, t, strlen(t), &o, &no) == 0 &&
                     sl_tokenizer_encode_special(tok, t, strlen(t), &sp, &ns) == 0;
            int enc = ok && ids_equal(a, na, cJSON_GetObjectItem(c, "ids"));
            int ord = ok && ids_equal(o, no, cJSON_GetObjectItem(c, "ids_ordinary"));
            int tpl = ok && ids_equal(sp, ns, cJSON_GetObjectItem(c, "ids_special"));
            int dec = enc && decoded_equal(tok, a, na, cJSON_GetObjectItem(c, "decoded"));
            CHECK_MSG(enc && ord && tpl && dec, "%s \"%s\": encode %d, ordinary %d, template %d, decode %d", name, t,
                      enc, ord, tpl, dec);
            if (!enc && ok) print_ids("got", a, na);
            free(a);
            free(o);
            free(sp);
        }
        sl_tokenizer_free(tok);
    }
    CHECK(n_edges >= 19);
    cJSON_Delete(edges);
    unlink(path);
    rmdir(dir);
}

static char tmp[256];

// Writes fixture LAYOUT's tokenizer.json with `from` replaced by `to` into tmp/tokenizer.json
// and returns whether loading it failed with a message holding every one of the NULL-ended words.
static int refused_in(const char *layout, const char *from, const char *to, const char *const *words) {
    size_t len;
    char src[256];
    snprintf(src, sizeof src, FIX_DIR "/%s/tokenizer.json", layout);
    char *text = sl_read_text_file(src, &len);
    char *hit = text ? strstr(text, from) : NULL;
    CHECK_MSG(hit != NULL, "fixture has no \"%s\"", from);
    if (!hit) { free(text); return 0; }
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", tmp);
    FILE *f = fopen(path, "wb");
    fwrite(text, 1, (size_t)(hit - text), f);
    fputs(to, f);
    fputs(hit + strlen(from), f);
    fclose(f);
    free(text);
    sl_tokenizer *tok = (sl_tokenizer *)1;
    int rc = sl_tokenizer_load_json(&tok, path, NULL);
    int ok = rc == -1 && tok == NULL;
    for (int i = 0; ok && words[i]; i++) ok = strstr(sl_error(), words[i]) != NULL;
    if (!ok) fprintf(stderr, "  replacing %s by %s: rc %d, message: %s\n", from, to, rc, sl_error());
    if (rc == 0) sl_tokenizer_free(tok);
    return ok;
}

static int refused(const char *from, const char *to, const char *const *words) {
    return refused_in("spm-llama2", from, to, words);
}

TEST(unsupported_or_broken_files_are_refused_by_name) {
    snprintf(tmp, sizeof tmp, "/tmp/shardlm_test_tokjson_XXXXXX");
    CHECK(mkdtemp(tmp) != NULL);
    CHECK(refused("\"type\": \"BPE\"", "\"type\": \"WordPiece\"",
                  (const char *const[]){"tokenizer.json", "model.type", "WordPiece", "only BPE", NULL}));
    CHECK(refused("\"type\": \"Prepend\"", "\"type\": \"Lowercase\"",
                  (const char *const[]){"normalizer.normalizers[0]", "Lowercase", "not supported", NULL}));
    CHECK(refused("\"pre_tokenizer\": null", "\"pre_tokenizer\": {\"type\": \"Whitespace\"}",
                  (const char *const[]){"pre_tokenizer", "Whitespace", "not supported", NULL}));
    CHECK(refused("\"type\": \"Fuse\"", "\"type\": \"WordPiece\"",
                  (const char *const[]){"decoder.decoders[2]", "WordPiece", NULL}));
    CHECK(refused("\"single_word\": false", "\"single_word\": true",
                  (const char *const[]){"added_tokens[0]", "<unk>", "single_word", NULL}));
    CHECK(refused("\"dropout\": null", "\"dropout\": 0.1", (const char *const[]){"model.dropout", NULL}));
    CHECK(refused("\"<0x41>\": 68,", "", (const char *const[]){"id 68", "neither", NULL}));
    CHECK(refused("\"<0x41>\": 68,", "\"<0x41>\": 69,", (const char *const[]){"model.vocab", "id 69", NULL}));
    CHECK(refused("\"merges\": [", "\"merges\": [\"\\u2581 zzzq\", ",
                  (const char *const[]){"model.merges[0]", "zzzq", "right token", "not in model.vocab", NULL}));
    CHECK(refused("\"merges\": [", "\"merges\": [\"a b c\", ", (const char *const[]){"model.merges[0]", "one space", NULL}));
    CHECK(refused("\"ids\": [\n          1\n        ]", "\"ids\": [\n          5000\n        ]",
                  (const char *const[]){"post_processor", "5000", NULL}));
    CHECK(refused("\"added_tokens\"", "\"added_tokens\": 7, \"x\"", (const char *const[]){"added_tokens", "array", NULL}));
    CHECK(refused("{", "[", (const char *const[]){"tokenizer.json", NULL}));
    CHECK(refused("\"id\": 2,", "\"id\": 2147483647,", (const char *const[]){"added_tokens[2]", "2147483647", NULL}));
    CHECK(refused("\"id\": 2,", "\"id\": 1073741823,", (const char *const[]){"ids run to 1073741823", NULL}));
    CHECK(refused("\"type\": \"Fuse\"", "\"type\": \"Replace\", \"pattern\": {\"String\": \"x\"}, \"content\": \"y\"",
                  (const char *const[]){"decoder.decoders[2]", "second Replace", NULL}));
    CHECK(refused("\"type\": \"Fuse\"", "\"type\": \"ByteFallback\"",
                  (const char *const[]){"decoder.decoders[3]", "Strip", "after Fuse", NULL}));
    CHECK(refused_in("metaspace-llama", "\"replacement\": \"\u2581\",", "\"replacement\": \"ab\",",
                     (const char *const[]){"pre_tokenizer.replacement", "one character", NULL}));
    CHECK(refused_in("bytelevel-llama3", "\"use_regex\": false\n      }", "\"use_regex\": false\n      }, {\"type\": \"Digits\"}",
                     (const char *const[]){"pre_tokenizer.pretokenizers[2]", "after ByteLevel", NULL}));
    CHECK(refused_in("bytelevel-llama3", "\"Regex\": \"(?i:", "\"Regex\": \"x*|(?i:",
                     (const char *const[]){"pre_tokenizer.pretokenizers[0].pattern", "empty", NULL}));
    CHECK(refused_in("bytelevel-llama3", "\"Regex\": \"(?i:", "\"Regex\": \"\\\\h|(?i:",
                     (const char *const[]){"pre_tokenizer.pretokenizers[0].pattern", "hex digit", NULL}));
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", tmp);
    unlink(path);
    rmdir(tmp);
}

TEST_MAIN()
