// test_tokenizer.c: the GPT-2 tokenizer against Hugging Face's ids (fixtures made by
// tests/reference/make_tokenizer_fixtures.py), decode(encode(x)) == x, loading errors, and BPE training.
#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/tokenizer.h"
#include "test.h"

#include <dirent.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#define FIX_DIR "tests/fixtures/tokenizer"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static sl_tokenizer *gpt2(void) {
    static sl_tokenizer *tok;
    if (!tok) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/gpt2", test_data_dir());
        if (sl_tokenizer_load_dir(&tok, dir) != 0) fprintf(stderr, "  cannot load GPT-2 tokenizer: %s\n", sl_error());
    }
    return tok;
}

// Parses "1,2,3" into ids; returns the count.
static size_t parse_ids(const char *s, int32_t *ids, size_t cap) {
    size_t n = 0;
    while (*s && *s != '\n' && n < cap) {
        char *end;
        ids[n++] = (int32_t)strtol(s, &end, 10);
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

TEST(gpt2_loads_with_expected_sizes) {
    sl_tokenizer *tok = gpt2();
    CHECK(tok != NULL);
    if (!tok) return;
    CHECK(sl_tokenizer_vocab_size(tok) == 50257);
    CHECK(sl_tokenizer_eot_id(tok) == 50256);
    CHECK(sl_tokenizer_num_merges(tok) == 50000);
    size_t n;
    const char *b = sl_tokenizer_token_bytes(tok, 50256, &n);
    CHECK(b && n == 13 && memcmp(b, "<|endoftext|>", 13) == 0);
    b = sl_tokenizer_token_bytes(tok, 220, &n);  // "Ġ" = space
    CHECK(b && n == 1 && b[0] == ' ');
    CHECK(sl_tokenizer_token_bytes(tok, 50257, &n) == NULL);
    CHECK(sl_tokenizer_token_bytes(tok, -1, &n) == NULL);
    CHECK(sl_byte_to_unicode(' ') == 0x120 && sl_byte_to_unicode('A') == 'A');
}

TEST(gpt2_matches_hf_on_tricky_strings) {
    sl_tokenizer *tok = gpt2();
    if (!tok) { CHECK(tok != NULL); return; }
    size_t flen;
    char *fix = sl_read_text_file(FIX_DIR "/gpt2_tricky.txt", &flen);
    CHECK_MSG(fix != NULL, "%s", sl_error());
    if (!fix) return;
    int cases = 0;
    for (char *line = strtok(fix, "\n"); line; line = strtok(NULL, "\n")) {
        char *sp = strchr(line, ' ');
        if (!sp) continue;
        size_t hn = (size_t)(sp - line), n = hn / 2;
        char *text = malloc(n + 1);
        for (size_t i = 0; i < n; i++) sscanf(line + 2 * i, "%2hhx", (unsigned char *)&text[i]);
        text[n] = '\0';
        int32_t want[4096];
        size_t nw = parse_ids(sp + 1, want, 4096);
        int32_t *ids; size_t ni;
        CHECK(sl_tokenizer_encode(tok, text, n, &ids, &ni) == 0);
        int same = ni == nw && memcmp(ids, want, ni * sizeof *ids) == 0;
        size_t k = 0;
        while (k < ni && k < nw && ids[k] == want[k]) k++;
        CHECK_MSG(same, "string \"%s\": got %zu ids, HF has %zu (first difference at %zu)", text, ni, nw, k);
        char *back; size_t bl;
        CHECK(sl_tokenizer_decode(tok, ids, ni, &back, &bl) == 0);
        CHECK_MSG(bl == n && memcmp(back, text, n) == 0, "decode(encode(\"%s\")) differs", text);
        free(back); free(ids); free(text);
        cases++;
    }
    CHECK(cases >= 20);
    free(fix);
}

TEST(gpt2_matches_hf_on_whole_corpus_and_round_trips) {
    sl_tokenizer *tok = gpt2();
    if (!tok) { CHECK(tok != NULL); return; }
    size_t flen;
    char *fix = sl_read_text_file(FIX_DIR "/gpt2_sotu.txt", &flen);
    CHECK_MSG(fix != NULL, "%s", sl_error());
    if (!fix) return;
    int files = 0, mismatched = 0;
    size_t total_bytes = 0, total_ids = 0;
    double t_encode = 0;
    char *save = NULL;
    for (char *line = strtok_r(fix, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char name[512], first[4096];
        size_t want_n;
        unsigned long long want_h;
        if (sscanf(line, "%511s %zu %llx %4095s", name, &want_n, &want_h, first) != 4) {
            CHECK_MSG(0, "bad fixture line: %.80s", line);
            continue;
        }
        char path[1024];
        snprintf(path, sizeof path, "%s/sotu/%s", test_data_dir(), name);
        size_t len;
        char *text = sl_read_text_file(path, &len);
        CHECK_MSG(text != NULL, "%s", sl_error());
        if (!text) continue;
        int32_t *ids; size_t n;
        double t0 = now_s();
        int rc = sl_tokenizer_encode(tok, text, len, &ids, &n);
        t_encode += now_s() - t0;
        CHECK_MSG(rc == 0, "%s: %s", name, sl_error());
        if (rc != 0) { free(text); continue; }
        int32_t want_first[64];
        size_t nf = parse_ids(first, want_first, 64);
        size_t k = 0;
        while (k < nf && k < n && ids[k] == want_first[k]) k++;
        int ok = n == want_n && test_fnv1a_ids(ids, n) == want_h;
        if (!ok) {
            mismatched++;
            if (k < nf) CHECK_MSG(0, "%s: %zu ids (HF %zu); first difference at position %zu: %d vs HF %d", name, n,
                                  want_n, k, k < n ? ids[k] : -1, want_first[k]);
            else CHECK_MSG(0, "%s: %zu ids (HF %zu); hash differs, first 64 ids agree", name, n, want_n);
        }
        char *back; size_t bl;
        CHECK(sl_tokenizer_decode(tok, ids, n, &back, &bl) == 0);
        CHECK_MSG(bl == len && memcmp(back, text, len) == 0, "%s: decode(encode(text)) != text", name);
        total_bytes += len; total_ids += n; files++;
        free(back); free(ids); free(text);
    }
    free(fix);
    CHECK(files == 233);
    CHECK(mismatched == 0);
    fprintf(stderr, "  corpus: %d files, %zu bytes -> %zu ids, encode %.2f s (%.1f MB/s)\n", files, total_bytes,
            total_ids, t_encode, total_bytes / 1e6 / (t_encode > 0 ? t_encode : 1));
}

TEST(encode_ordinary_keeps_endoftext_as_text) {
    sl_tokenizer *tok = gpt2();
    if (!tok) { CHECK(tok != NULL); return; }
    const char *s = "a<|endoftext|>b";
    int32_t *ids; size_t n;
    CHECK(sl_tokenizer_encode_ordinary(tok, s, strlen(s), &ids, &n) == 0);
    int has_eot = 0;
    for (size_t i = 0; i < n; i++) has_eot |= ids[i] == 50256;
    CHECK(!has_eot && n > 3);
    free(ids);
    CHECK(sl_tokenizer_encode(tok, s, strlen(s), &ids, &n) == 0);
    CHECK(n == 3 && ids[1] == 50256);
    free(ids);
    CHECK(sl_tokenizer_encode(tok, "", 0, &ids, &n) == 0);
    CHECK(n == 0 && ids != NULL);
    free(ids);
}

TEST(arbitrary_bytes_round_trip) {
    sl_tokenizer *tok = gpt2();
    if (!tok) { CHECK(tok != NULL); return; }
    unsigned char buf[4096];
    uint64_t x = 12345;
    for (int round = 0; round < 20; round++) {
        size_t n = 1 + (size_t)(round * 197) % sizeof buf;
        for (size_t i = 0; i < n; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            buf[i] = (unsigned char)(x >> 56);
            if (round % 2) buf[i] = (buf[i] & 0x7F) | (i % 5 == 0 ? 0x80 : 0);  // mostly ASCII, stray high bytes
        }
        int32_t *ids; size_t ni;
        CHECK_MSG(sl_tokenizer_encode(tok, (char *)buf, n, &ids, &ni) == 0, "%s", sl_error());
        char *back; size_t bl;
        CHECK(sl_tokenizer_decode(tok, ids, ni, &back, &bl) == 0);
        CHECK_MSG(bl == n && memcmp(back, buf, n) == 0, "round %d: %zu bytes round-tripped to %zu", round, n, bl);
        free(back); free(ids);
    }
    int32_t bad = 50257;
    char *t; size_t tl;
    CHECK(sl_tokenizer_decode(tok, &bad, 1, &t, &tl) == -1);
    CHECK(strstr(sl_error(), "50257") != NULL);
}

static char tmpdir[256];
static const char *make_tmpdir(void) {
    if (!tmpdir[0]) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/shardlm_test_tok_XXXXXX");
        if (!mkdtemp(tmpdir)) tmpdir[0] = '\0';
    }
    return tmpdir;
}

static void write_text(const char *path, const char *s) {
    FILE *f = fopen(path, "wb");
    if (f) { fputs(s, f); fclose(f); }
}

TEST(load_errors_name_the_file) {
    const char *d = make_tmpdir();
    char v[512], m[512];
    snprintf(v, sizeof v, "%s/missing_vocab.json", d);
    snprintf(m, sizeof m, "%s/missing_merges.txt", d);
    sl_tokenizer *tok = (sl_tokenizer *)1;
    CHECK(sl_tokenizer_load(&tok, v, m) == -1 && tok == NULL);
    CHECK(strstr(sl_error(), "missing_vocab.json") != NULL);
    snprintf(v, sizeof v, "%s/bad_vocab.json", d);
    write_text(v, "[1, 2, 3]");
    CHECK(sl_tokenizer_load(&tok, v, m) == -1);
    CHECK(strstr(sl_error(), "bad_vocab.json") != NULL);
    char vdir[512];
    snprintf(vdir, sizeof vdir, "%s/no_such_dir", d);
    CHECK(sl_tokenizer_load_dir(&tok, vdir) == -1);
    CHECK(strstr(sl_error(), "no_such_dir") != NULL);
    // A merge whose halves are not in the vocab.
    char gv[512];
    snprintf(gv, sizeof gv, "%s/gpt2/encoder.json", test_data_dir());
    snprintf(m, sizeof m, "%s/bad_merges.txt", d);
    write_text(m, "#version: 0.2\nĠ t\nzzzzqq xxyyq\n");
    CHECK(sl_tokenizer_load(&tok, gv, m) == -1);
    CHECK(strstr(sl_error(), "bad_merges.txt:3") != NULL);
    unlink(v); unlink(m);
}

// Writes DIR/NAME: a vocab.json of the 256 byte tokens (ids 0..255) plus `extra` (JSON members,
// with a leading comma), and an empty merges.txt beside it; returns the vocab path in v.
static void write_byte_vocab(const char *name, const char *extra, char *v, size_t cap, char *m, size_t mcap) {
    size_t n = 0, room = 8192;
    char *json = malloc(room);
    n += (size_t)snprintf(json + n, room - n, "{");
    for (int b = 0; b < 256; b++) {
        uint32_t cp = sl_byte_to_unicode((uint8_t)b);
        char u[4] = {0};
        if (cp < 0x80) u[0] = (char)cp;
        else { u[0] = (char)(0xC0 | (cp >> 6)); u[1] = (char)(0x80 | (cp & 0x3F)); }
        if (cp == '"' || cp == '\\') n += (size_t)snprintf(json + n, room - n, "%s\"\\%s\": %d", b ? ", " : "", u, b);
        else n += (size_t)snprintf(json + n, room - n, "%s\"%s\": %d", b ? ", " : "", u, b);
    }
    snprintf(json + n, room - n, "%s}", extra);
    snprintf(v, cap, "%s/%s", make_tmpdir(), name);
    snprintf(m, mcap, "%s/%s.merges", make_tmpdir(), name);
    write_text(v, json);
    write_text(m, "#version: 0.2\n");
    free(json);
}

// Every malformed vocab.json entry: one error naming the file, the token and what was expected
// (these read freed memory before: the message quoted the parsed tree after deleting it).
TEST(bad_vocab_entries_name_the_file_token_and_expectation) {
    struct { const char *name, *extra, *want[3]; } cases[] = {
        {"dup.json", ", \"ab\": 5", {"token \"ab\": id 5 is already taken by token", "exactly once", NULL}},
        {"frac.json", ", \"ab\": 2.5", {"token \"ab\": expected an integer id in [0, 257)", "found 2.5", NULL}},
        {"neg.json", ", \"ab\": -1", {"token \"ab\": expected an integer id in [0, 257)", "found -1", NULL}},
        {"big.json", ", \"ab\": 257", {"token \"ab\": expected an integer id in [0, 257)", "found 257", NULL}},
        {"huge.json", ", \"ab\": 1e300", {"token \"ab\": expected an integer id", "found 1e+300", NULL}},
        {"str.json", ", \"ab\": \"256\"", {"token \"ab\": expected an integer id in [0, 257), found a string", NULL}},
        {"null.json", ", \"ab\": null", {"token \"ab\": expected an integer id in [0, 257), found null", NULL}},
        {"euro.json", ", \"a\xe2\x82\xac\": 256",
         {"token \"a\xe2\x82\xac\" (id 256): character U+20AC at byte 1 is outside GPT-2's byte alphabet",
          "expected only the code points", NULL}},
        {"ctrl.json", ", \"\\u0001x\": 256", {"token \"\\x01x\" (id 256): character U+0001 at byte 0", NULL}},
        {"utf8.json", ", \"a\xc3\": 256", {"(id 256): invalid UTF-8 at byte 1", NULL}},
        {"empty.json", ", \"\": 256", {"empty token (id 256): expected at least one byte", NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char v[512], m[512];
        write_byte_vocab(cases[i].name, cases[i].extra, v, sizeof v, m, sizeof m);
        sl_tokenizer *tok = (sl_tokenizer *)1;
        CHECK(sl_tokenizer_load(&tok, v, m) == -1 && tok == NULL);
        CHECK_MSG(strstr(sl_error(), v) != NULL, "%s: %s", cases[i].name, sl_error());
        for (int k = 0; k < 3 && cases[i].want[k]; k++)
            CHECK_MSG(strstr(sl_error(), cases[i].want[k]) != NULL, "%s: want \"%s\" in: %s", cases[i].name,
                      cases[i].want[k], sl_error());
        unlink(v); unlink(m);
    }
    // the same vocab without the bad entry loads
    char v[512], m[512];
    write_byte_vocab("ok.json", ", \"ab\": 256", v, sizeof v, m, sizeof m);
    sl_tokenizer *tok = NULL;
    CHECK_MSG(sl_tokenizer_load(&tok, v, m) == 0, "%s", sl_error());
    CHECK(tok && sl_tokenizer_vocab_size(tok) == 257);
    sl_tokenizer_free(tok);
    unlink(v); unlink(m);
}

// Reads merges.txt lines (after the header) into an array of strings.
static int read_lines(const char *path, char ***out) {
    size_t len;
    char *text = sl_read_text_file(path, &len);
    if (!text) return -1;
    int n = 0;
    char **lines = malloc(sizeof(char *) * (len + 1));
    for (char *l = strtok(text, "\n"); l; l = strtok(NULL, "\n")) lines[n++] = strdup(l);
    free(text);
    *out = lines;
    return n;  // the caller frees each line and the array
}

TEST(bpe_training_round_trip_and_merges_in_order) {
    const char *d = make_tmpdir();
    // A small corpus: three SOTU addresses (about 100 KB) keeps this fast under sanitizers.
    const char *names[] = {"1790_george_washington_n.txt", "1861_abraham_lincoln_r.txt", "1941_franklin_d_roosevelt_d.txt"};
    char *texts[3]; size_t lens[3];
    size_t total = 0;
    for (int i = 0; i < 3; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/sotu/%s", test_data_dir(), names[i]);
        texts[i] = sl_read_text_file(path, &lens[i]);
        CHECK_MSG(texts[i] != NULL, "%s", sl_error());
        if (!texts[i]) return;
        total += lens[i];
    }
    char out1[512], out2[512];
    snprintf(out1, sizeof out1, "%s/bpe1", d);
    snprintf(out2, sizeof out2, "%s/bpe2/nested", d);
    double t0 = now_s();
    CHECK_MSG(sl_bpe_train((const char *const *)texts, lens, 3, 600, out1, 0) == 0, "%s", sl_error());
    fprintf(stderr, "  trained 600-id BPE on %zu bytes in %.2f s\n", total, now_s() - t0);
    CHECK_MSG(sl_bpe_train((const char *const *)texts, lens, 3, 600, out2, 0) == 0, "%s", sl_error());
    sl_tokenizer *tok;
    CHECK_MSG(sl_tokenizer_load_dir(&tok, out1) == 0, "%s", sl_error());
    if (!tok) return;
    CHECK(sl_tokenizer_vocab_size(tok) == 600);
    CHECK(sl_tokenizer_eot_id(tok) == 599);
    CHECK(sl_tokenizer_num_merges(tok) == 600 - 257);
    for (int b = 0; b < 256; b++) {
        size_t n;
        const char *p = sl_tokenizer_token_bytes(tok, b, &n);
        CHECK(p && n == 1 && (unsigned char)p[0] == b);
    }
    // Training is deterministic: a second run writes the same merges.
    char m1[600], m2[600];
    snprintf(m1, sizeof m1, "%s/merges.txt", out1);
    snprintf(m2, sizeof m2, "%s/merges.txt", out2);
    char **l1 = NULL, **l2 = NULL;
    int n1 = read_lines(m1, &l1), n2 = read_lines(m2, &l2);
    CHECK(n1 == 1 + 343 && n1 == n2);
    CHECK(n1 > 0 && strcmp(l1[0], "#version: 0.2") == 0);
    int same = n1 == n2;
    for (int i = 0; i < n1 && i < n2; i++) same &= strcmp(l1[i], l2[i]) == 0;
    CHECK_MSG(same, "training twice on the same corpus gave different merges");
    // Merges are in id order: line i (after the header) creates id 255 + i from two earlier tokens.
    int in_order = 1;
    for (int i = 1; i < n1 && in_order; i++) {
        char bytes[256];
        size_t nb = 0, cut = 0;
        for (const unsigned char *q = (const unsigned char *)l1[i]; *q && nb < sizeof bytes;) {
            if (*q == ' ') { cut = nb; q++; continue; }
            uint32_t cp = *q < 0x80 ? *q : (uint32_t)(q[0] & 0x1F) << 6 | (q[1] & 0x3F);
            q += *q < 0x80 ? 1 : 2;
            for (int b = 0; b < 256; b++)
                if (sl_byte_to_unicode((uint8_t)b) == cp) { bytes[nb++] = (char)b; break; }
        }
        int merged = -1, left = -1, right = -1;
        for (int id = 0; id < 600; id++) {
            size_t n;
            const char *p = sl_tokenizer_token_bytes(tok, id, &n);
            if (n == nb && memcmp(p, bytes, nb) == 0) merged = id;
            if (n == cut && memcmp(p, bytes, cut) == 0) left = id;
            if (n == nb - cut && memcmp(p, bytes + cut, nb - cut) == 0) right = id;
        }
        in_order = merged == 255 + i && left >= 0 && left < merged && right >= 0 && right < merged;
        CHECK_MSG(in_order, "merges.txt line %d \"%s\": merged id %d (want %d), halves %d and %d", i + 1, l1[i],
                  merged, 255 + i, left, right);
    }
    for (int i = 0; i < n1; i++) free(l1[i]);
    for (int i = 0; i < n2; i++) free(l2[i]);
    free(l1); free(l2);
    // Each merged token's bytes are the concatenation of two earlier tokens (ids < its own).
    for (int id = 256; id < 599; id++) {
        size_t n;
        const char *p = sl_tokenizer_token_bytes(tok, id, &n);
        int found = 0;
        for (size_t cut = 1; cut < n && !found; cut++) {
            for (int a = 0; a < id && !found; a++) {
                size_t na;
                const char *pa = sl_tokenizer_token_bytes(tok, a, &na);
                if (na != cut || memcmp(pa, p, cut) != 0) continue;
                for (int b = 0; b < id && !found; b++) {
                    size_t nb;
                    const char *pb = sl_tokenizer_token_bytes(tok, b, &nb);
                    found = nb == n - cut && memcmp(pb, p + cut, nb) == 0;
                }
            }
        }
        if (!found) { CHECK_MSG(found, "token %d is not the merge of two earlier tokens", id); break; }
    }
    // Round trip and compression on the training text and on unseen text.
    size_t total_ids = 0;
    for (int i = 0; i < 3; i++) {
        int32_t *ids; size_t n;
        CHECK(sl_tokenizer_encode(tok, texts[i], lens[i], &ids, &n) == 0);
        char *back; size_t bl;
        CHECK(sl_tokenizer_decode(tok, ids, n, &back, &bl) == 0);
        CHECK(bl == lens[i] && memcmp(back, texts[i], bl) == 0);
        total_ids += n;
        free(back); free(ids);
        free(texts[i]);
    }
    CHECK_MSG(total_ids * 2 < total, "600-id BPE should at least halve the length: %zu bytes -> %zu ids", total,
              total_ids);
    const char *unseen = "Ünïcödé ✓ <|endoftext|> and 12345 plain words";
    int32_t *ids; size_t n;
    CHECK(sl_tokenizer_encode(tok, unseen, strlen(unseen), &ids, &n) == 0);
    char *back; size_t bl;
    CHECK(sl_tokenizer_decode(tok, ids, n, &back, &bl) == 0);
    CHECK(bl == strlen(unseen) && memcmp(back, unseen, bl) == 0);
    free(back); free(ids);
    sl_tokenizer_free(tok);
    CHECK(sl_bpe_train((const char *const *)texts, lens, 0, 100, out1, 0) == -1);  // vocab < 257
}

TEST(cleanup) {
    char cmd[600];
    if (tmpdir[0]) { snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir); CHECK(system(cmd) == 0); }
    sl_tokenizer_free(gpt2());
}

TEST_MAIN()
