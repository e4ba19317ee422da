// test_safetensors.c: the safetensors reader and writer: round trip, F16/BF16/F64 conversion, the
// Hugging Face fixtures, and every malformed-input case the reader promises to reject with a
// message naming the file and tensor (these also run under ASan/UBSan via `make test`).
#include "test.h"

#include "shardlm/error.h"
#include "shardlm/safetensors.h"

#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static char *tmp_path(const char *name) {
    static char buf[8][256];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 256, "/tmp/sl_test_st_%d_%s", (int)getpid(), name);
    return p;
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

// Writes 8-byte length + header + `data_len` bytes of data (0x11 pattern) verbatim.
static void write_raw(const char *path, const char *header, size_t data_len) {
    FILE *f = fopen(path, "wb");
    uint64_t n = strlen(header);
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(n >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(header, 1, n, f);
    for (size_t i = 0; i < data_len; i++) fputc(0x11, f);
    fclose(f);
}

static void write_bytes(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, len, f);
    fclose(f);
}

// Opening must fail, and the message must contain every one of the given fragments.
static void expect_open_error(const char *path, const char *frag1, const char *frag2) {
    sl_st_file f;
    sl_errorf("(none)");
    int rc = sl_st_open(&f, path);
    CHECK_MSG(rc == -1, "opening %s should fail", path);
    if (rc == 0) { sl_st_close(&f); return; }
    const char *msg = sl_error();
    CHECK_MSG(strstr(msg, path) != NULL, "message lacks the path: %s", msg);
    if (frag1) CHECK_MSG(strstr(msg, frag1) != NULL, "message lacks \"%s\": %s", frag1, msg);
    if (frag2) CHECK_MSG(strstr(msg, frag2) != NULL, "message lacks \"%s\": %s", frag2, msg);
    sl_st_close(&f);   // closing a failed open is allowed
}

TEST(roundtrip_f32_with_metadata) {
    const char *path = tmp_path("rt.safetensors");
    float a[6] = {1.0f, -2.5f, 3.25f, 1e-30f, -0.0f, 65504.0f}, b[3] = {7, 8, 9}, s[1] = {42.0f};
    sl_st_desc d[4] = {{"a.weight", 2, {2, 3}}, {"b.bias", 1, {3}}, {"scalar", 0, {0}}, {"empty", 2, {0, 5}}};
    const float *data[4] = {a, b, s, NULL};
    const char *mk[] = {"format", "step"}, *mv[] = {"pt", "100"};
    CHECK(sl_st_write_f32(path, 4, d, data, 2, mk, mv) == 0);
    char tmpname[300];
    snprintf(tmpname, sizeof tmpname, "%s.tmp.%d", path, (int)getpid());
    CHECK(!file_exists(tmpname));
    sl_st_file f;
    CHECK_MSG(sl_st_open(&f, path) == 0, "%s", sl_error());
    CHECK(f.n_tensors == 4);
    CHECK(f.data_start % 8 == 0);
    CHECK(sl_st_metadata(&f, "format") && strcmp(sl_st_metadata(&f, "format"), "pt") == 0);
    CHECK(sl_st_metadata(&f, "step") && strcmp(sl_st_metadata(&f, "step"), "100") == 0);
    CHECK(sl_st_metadata(&f, "nope") == NULL);
    int ia = sl_st_find(&f, "a.weight"), ib = sl_st_find(&f, "b.bias"), is = sl_st_find(&f, "scalar"),
        ie = sl_st_find(&f, "empty");
    CHECK(ia >= 0 && ib >= 0 && is >= 0 && ie >= 0 && sl_st_find(&f, "missing") == -1);
    if (ia >= 0 && ib >= 0 && is >= 0 && ie >= 0) {
        CHECK(f.tensors[ia].ndim == 2 && f.tensors[ia].shape[0] == 2 && f.tensors[ia].shape[1] == 3);
        CHECK(f.tensors[ia].dtype == SL_ST_F32 && f.tensors[ia].numel == 6);
        CHECK(f.tensors[is].ndim == 0 && f.tensors[is].numel == 1);
        CHECK(f.tensors[ie].numel == 0);
        float ra[6], rb[3], rs[1], part[2];
        CHECK(sl_st_read_f32(&f, ia, ra, 6) == 0 && memcmp(ra, a, sizeof a) == 0);
        CHECK(sl_st_read_f32(&f, ib, rb, 3) == 0 && memcmp(rb, b, sizeof b) == 0);
        CHECK(sl_st_read_f32(&f, is, rs, 1) == 0 && rs[0] == 42.0f);
        CHECK(sl_st_read_f32_range(&f, ia, 3, 2, part) == 0 && part[0] == a[3] && part[1] == a[4]);
        CHECK(sl_st_read_f32_range(&f, ia, 5, 2, part) == -1 && strstr(sl_error(), "a.weight"));
        CHECK(sl_st_read_f32(&f, ia, ra, 5) == -1 && strstr(sl_error(), "a.weight"));
    }
    sl_st_close(&f);
    unlink(path);
}

TEST(writer_overwrites_atomically_and_checks_counts) {
    const char *path = tmp_path("w.safetensors");
    float x[4] = {1, 2, 3, 4};
    sl_st_desc d = {"x", 1, {4}};
    const float *data[1] = {x};
    CHECK(sl_st_write_f32(path, 1, &d, data, 0, NULL, NULL) == 0);
    // too many floats: refused; finishing short: refused, old file intact, no temp file left
    sl_st_writer *w;
    CHECK(sl_st_writer_open(&w, path, 1, &d, 0, NULL, NULL) == 0);
    float big[5] = {9, 9, 9, 9, 9};
    CHECK(sl_st_writer_write(w, big, 5) == -1 && strstr(sl_error(), path));
    CHECK(sl_st_writer_write(w, big, 3) == 0);
    CHECK(sl_st_writer_finish(w) == -1 && strstr(sl_error(), "declares"));
    char tmpname[300];
    snprintf(tmpname, sizeof tmpname, "%s.tmp.%d", path, (int)getpid());
    CHECK(!file_exists(tmpname));
    sl_st_file f;
    float r[4];
    CHECK(sl_st_open(&f, path) == 0 && sl_st_read_f32(&f, 0, r, 4) == 0 && memcmp(r, x, sizeof x) == 0);
    sl_st_close(&f);
    // abort leaves the old file too
    CHECK(sl_st_writer_open(&w, path, 1, &d, 0, NULL, NULL) == 0);
    sl_st_writer_abort(w);
    CHECK(!file_exists(tmpname) && file_exists(path));
    // bad descriptors and an unwritable directory
    sl_st_desc neg = {"n", 1, {-3}};
    CHECK(sl_st_writer_open(&w, path, 1, &neg, 0, NULL, NULL) == -1 && strstr(sl_error(), "negative"));
    sl_st_desc dup[2] = {{"x", 1, {1}}, {"x", 1, {1}}};
    CHECK(sl_st_writer_open(&w, path, 2, dup, 0, NULL, NULL) == -1 && strstr(sl_error(), "twice"));
    CHECK(sl_st_write_f32("/nonexistent_dir_sl/x.safetensors", 1, &d, data, 0, NULL, NULL) == -1 &&
          strstr(sl_error(), "/nonexistent_dir_sl/x.safetensors"));
    unlink(path);
}

TEST(reads_f16_bf16_f64_including_special_values) {
    const char *path = tmp_path("half.safetensors");
    // F16: 1, -2, smallest subnormal 2^-24, largest subnormal, inf, -0, 65504, 0.5
    uint16_t h[8] = {0x3c00, 0xc000, 0x0001, 0x03ff, 0x7c00, 0x8000, 0x7bff, 0x3800};
    uint16_t bf[4] = {0x3f80, 0xc0a0, 0, 0};   // 1, -5, 0, 0 (no gap before the F64 tensor)
    double dd[2] = {0.1, -1e10};
    char header[512];
    snprintf(header, sizeof header,
             "{\"h\":{\"dtype\":\"F16\",\"shape\":[2,4],\"data_offsets\":[0,16]},"
             "\"bf\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[16,24]},"
             "\"d\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[24,40]},"
             "\"i\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[40,48]}}");
    unsigned char data[48] = {0};
    memcpy(data, h, 16);
    memcpy(data + 16, bf, 8);
    memcpy(data + 24, dd, 16);
    FILE *fp = fopen(path, "wb");
    uint64_t n = strlen(header);
    fwrite(&n, 8, 1, fp);
    fwrite(header, 1, n, fp);
    fwrite(data, 1, sizeof data, fp);
    fclose(fp);
    sl_st_file f;
    CHECK_MSG(sl_st_open(&f, path) == 0, "%s", sl_error());
    float r[8];
    CHECK(sl_st_read_f32(&f, sl_st_find(&f, "h"), r, 8) == 0);
    CHECK(r[0] == 1.0f && r[1] == -2.0f && r[2] == ldexpf(1.0f, -24) && r[3] == 1023.0f * ldexpf(1.0f, -24));
    CHECK(isinf(r[4]) && r[4] > 0 && r[5] == 0.0f && signbit(r[5]) && r[6] == 65504.0f && r[7] == 0.5f);
    CHECK(sl_st_read_f32(&f, sl_st_find(&f, "bf"), r, 4) == 0 && r[0] == 1.0f && r[1] == -5.0f);
    CHECK(sl_st_read_f32(&f, sl_st_find(&f, "d"), r, 2) == 0 && r[0] == 0.1f && r[1] == -1e10f);
    // integer tensors open fine but do not read as float
    int ii = sl_st_find(&f, "i");
    CHECK(ii >= 0 && f.tensors[ii].dtype == SL_ST_I64);
    CHECK(sl_st_read_f32(&f, ii, r, 8) == -1 && strstr(sl_error(), "I64") && strstr(sl_error(), "\"i\""));
    sl_st_close(&f);
    unlink(path);
}

TEST(reads_hf_fixtures_in_all_dtypes) {
    sl_st_file f32, b16, f16;
    CHECK_MSG(sl_st_open(&f32, "tests/fixtures/hf/gpt2/model.safetensors") == 0, "%s", sl_error());
    CHECK_MSG(sl_st_open(&b16, "tests/fixtures/hf/gpt2-bf16/model.safetensors") == 0, "%s", sl_error());
    CHECK_MSG(sl_st_open(&f16, "tests/fixtures/hf/gpt2-hub-f16/model.safetensors") == 0, "%s", sl_error());
    CHECK(sl_st_metadata(&f32, "format") && strcmp(sl_st_metadata(&f32, "format"), "pt") == 0);
    int a = sl_st_find(&f32, "transformer.h.1.mlp.c_fc.weight"), b = sl_st_find(&b16, "transformer.h.1.mlp.c_fc.weight"),
        c = sl_st_find(&f16, "h.1.mlp.c_fc.weight");
    CHECK(a >= 0 && b >= 0 && c >= 0);
    if (a >= 0 && b >= 0 && c >= 0) {
        CHECK(f32.tensors[a].dtype == SL_ST_F32 && b16.tensors[b].dtype == SL_ST_BF16 && f16.tensors[c].dtype == SL_ST_F16);
        CHECK(f32.tensors[a].shape[0] == 32 && f32.tensors[a].shape[1] == 128);
        size_t n = f32.tensors[a].numel;
        float *x = malloc(n * 4), *y = malloc(n * 4), *z = malloc(n * 4);
        CHECK(sl_st_read_f32(&f32, a, x, n) == 0 && sl_st_read_f32(&b16, b, y, n) == 0 && sl_st_read_f32(&f16, c, z, n) == 0);
        double eb = 0, eh = 0;
        for (size_t i = 0; i < n; i++) {
            eb = fmax(eb, fabs(x[i] - y[i]));
            eh = fmax(eh, fabs(x[i] - z[i]));
        }
        CHECK_MSG(eb <= 1.0 / 256 && eb > 0, "bf16 max error %g", eb);   // values in [-1, 1]: 8-bit mantissa
        CHECK_MSG(eh <= 1.0 / 2048 && eh > 0, "f16 max error %g", eh);
        free(x); free(y); free(z);
    }
    sl_st_close(&f32); sl_st_close(&b16); sl_st_close(&f16);
}

TEST(rejects_short_and_oversized_headers) {
    const char *p = tmp_path("bad.safetensors");
    write_bytes(p, "\x10\x00\x00", 3);
    expect_open_error(p, "too short", NULL);
    write_raw(p, "{}", 0);   // valid: empty file
    sl_st_file f;
    CHECK(sl_st_open(&f, p) == 0 && f.n_tensors == 0);
    sl_st_close(&f);
    unsigned char big[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};   // header length 65535 > file
    write_bytes(p, big, 16);
    expect_open_error(p, "header length 65535", "larger than the file");
    unsigned char huge[8] = {0, 0, 0, 0, 0, 0, 0, 0x80};   // 2^63
    write_bytes(p, huge, 8);
    expect_open_error(p, "header length", NULL);
    // an absurd (> 100 MB) header inside a file that is big enough: a sparse 200 MB file
    int fd = open(p, O_WRONLY | O_TRUNC);
    unsigned char len150[8] = {0x00, 0x00, 0x60, 0x09, 0, 0, 0, 0};   // 0x09600000 = 150 MiB
    CHECK(write(fd, len150, 8) == 8);
    CHECK(ftruncate(fd, 200L << 20) == 0);
    close(fd);
    expect_open_error(p, "absurd", NULL);
    expect_open_error(tmp_path("does_not_exist.safetensors"), "cannot open", NULL);
    unlink(p);
}

TEST(rejects_malformed_json_and_fields) {
    const char *p = tmp_path("bad2.safetensors");
    write_raw(p, "{\"a\": {\"dtype\": \"F32\", ", 0);
    expect_open_error(p, "not valid JSON", NULL);
    write_raw(p, "[1, 2]", 0);
    expect_open_error(p, "JSON object", NULL);
    write_raw(p, "{} trailing", 0);
    expect_open_error(p, "unexpected bytes", NULL);
    write_raw(p, "{\"w\": 3}", 0);
    expect_open_error(p, "\"w\"", "expected an object");
    write_raw(p, "{\"w\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4);
    expect_open_error(p, "\"w\"", "dtype");
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4);
    expect_open_error(p, "\"w\"", "shape");
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4);
    expect_open_error(p, "\"w\"", "data_offsets");
    write_raw(p, "{\"w\": {\"dtype\": \"F17\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4);
    expect_open_error(p, "\"w\"", "unknown dtype \"F17\"");
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [2, -3], \"data_offsets\": [0, 4]}}", 4);
    expect_open_error(p, "\"w\"", "negative dimension");
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", 4);
    expect_open_error(p, "\"w\"", "shape entries must be integers in [0, 2^53], found 1.5");
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 4]}}", 4);
    expect_open_error(p, "\"w\"", "dims");
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 4294967296], \"data_offsets\": [0, 4]}}", 4);
    expect_open_error(p, "\"w\"", "overflows");
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 20]}}", 24);
    expect_open_error(p, "\"w\"", "needs 24 bytes");
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}", 8);
    expect_open_error(p, "\"w\"", "end before begin");
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", 8);
    expect_open_error(p, "\"w\"", "[begin, end]");
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 12);
    expect_open_error(p, "\"w\"", "past the data section");
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                 " \"v\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}", 12);
    expect_open_error(p, "overlap", "\"w\"");
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                 " \"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8);
    expect_open_error(p, "\"w\"", "twice");
    write_raw(p, "{\"__metadata__\": {\"format\": 1}}", 0);
    expect_open_error(p, "__metadata__", "format");
    write_raw(p, "{\"__metadata__\": [1]}", 0);
    expect_open_error(p, "__metadata__", NULL);
    unlink(p);
}

TEST(rejects_truncated_and_corrupted_real_file) {
    const char *src = "tests/fixtures/hf/llama/model.safetensors";
    const char *p = tmp_path("trunc.safetensors");
    FILE *f = fopen(src, "rb");
    CHECK(f != NULL);
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *buf = malloc((size_t)n);
    CHECK(fread(buf, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    write_bytes(p, buf, (size_t)n - 4);              // last tensor cut short
    expect_open_error(p, "past the data section", NULL);
    write_bytes(p, buf, 100);                        // cut inside the header
    expect_open_error(p, "larger than the file", NULL);
    buf[8] = '#';                                    // a corrupted header byte
    write_bytes(p, buf, (size_t)n);
    expect_open_error(p, "not valid JSON", NULL);
    free(buf);
    unlink(p);
}

// The tensors must cover the data section exactly: no gap at its start, between tensors or after the
// last one (a header length one less, a padding space dropped, used to read every tensor one byte off).
TEST(tensors_must_tile_the_data_section) {
    const char *p = tmp_path("tile.safetensors");
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8);
    expect_open_error(p, "data bytes [0, 4) belong to no tensor (the data section's start; tensor \"w\" begins at 4)",
                      "expected data_offsets contiguous from 0");
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                 " \"v\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}", 12);
    expect_open_error(p, "data bytes [4, 8) belong to no tensor (after tensor \"w\"; tensor \"v\" begins at 8)", NULL);
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 8);
    expect_open_error(p, "the tensors end at data byte 4 but the data section holds 8 bytes",
                      "expected them to cover it exactly");
    write_raw(p, "{}", 4);
    expect_open_error(p, "the tensors end at data byte 0 but the data section holds 4 bytes", NULL);
    // offsets beyond 2^53 say the range, not "non-negative"
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 1152921504606846976]}}", 4);
    expect_open_error(p, "data_offsets must be integers in [0, 2^53] (at most the data section's 4 bytes), found "
                      "1152921504606846976", NULL);
    // a real file whose header length drops one trailing padding space
    float a[3] = {1, 2, 3}, b[2] = {4, 5};
    sl_st_desc d[2] = {{"a", 1, {3}}, {"bb", 1, {2}}};
    const float *data[2] = {a, b};
    CHECK(sl_st_write_f32(p, 2, d, data, 0, NULL, NULL) == 0);
    FILE *f = fopen(p, "r+b");
    unsigned char len[8];
    CHECK(f && fread(len, 1, 8, f) == 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | len[i];
    CHECK(fseek(f, (long)(8 + n - 1), SEEK_SET) == 0 && fgetc(f) == ' ');   // the header ends in padding
    n--;
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(n >> (8 * i));
    rewind(f);
    CHECK(fwrite(len, 1, 8, f) == 8);
    fclose(f);
    expect_open_error(p, "the tensors end at data byte 20 but the data section holds 21 bytes", NULL);
    unlink(p);
}

TEST_MAIN()
