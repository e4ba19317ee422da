// test_shard.c: token shard writer/reader round trips (uint16 and uint32) and every malformed-shard
// case (short file, wrong magic, unknown version, count vs size mismatch, bad token id, missing file),
// each of which must fail with -1 and a message naming the file.
#include "shardlm/error.h"
#include "shardlm/shard.h"
#include "test.h"

#include <stdint.h>
#include <unistd.h>

static char dir[256];
static const char *tmp_path(const char *name) {
    static char path[512];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/shardlm_test_shard_XXXXXX");
        if (!mkdtemp(dir)) dir[0] = '\0';
    }
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return path;
}

static void write_raw(const char *path, const int32_t *header, const void *body, size_t body_bytes, size_t header_bytes) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(header, 1, header_bytes, f);
    if (body_bytes) fwrite(body, 1, body_bytes, f);
    fclose(f);
}

TEST(round_trip_uint16) {
    const char *p = tmp_path("u16.bin");
    int32_t toks[1000];
    for (int i = 0; i < 1000; i++) toks[i] = (i * 7919) % 50257;
    CHECK_MSG(sl_shard_write(p, toks, 1000, 50257) == 0, "%s", sl_error());
    FILE *f = fopen(p, "rb");
    int32_t h[3] = {0};
    CHECK(f && fread(h, 4, 3, f) == 3);
    if (f) { fseek(f, 0, SEEK_END); CHECK(ftell(f) == 1024 + 2000); fclose(f); }
    CHECK(h[0] == 20240520 && h[1] == 1 && h[2] == 1000);
    int32_t *back; size_t n;
    CHECK_MSG(sl_shard_read(p, 50257, &back, &n) == 0, "%s", sl_error());
    CHECK(n == 1000 && memcmp(back, toks, sizeof toks) == 0);
    free(back);
    sl_shard s;
    CHECK(sl_shard_open(&s, p) == 0);
    int32_t part[10];
    CHECK(sl_shard_read_tokens(&s, 990, 10, 0, part) == 0 && memcmp(part, toks + 990, sizeof part) == 0);
    CHECK(sl_shard_read_tokens(&s, 995, 10, 0, part) == -1);  // past the end
    CHECK(strstr(sl_error(), "u16.bin") != NULL);
    sl_shard_close(&s);
    // Zero tokens is a valid (if useless) shard.
    CHECK(sl_shard_write(tmp_path("empty.bin"), toks, 0, 50257) == 0);
    CHECK(sl_shard_read(tmp_path("empty.bin"), 50257, &back, &n) == 0 && n == 0);
    free(back);
}

TEST(round_trip_uint32_for_large_vocab) {
    const char *p = tmp_path("u32.bin");
    int32_t toks[500];
    for (int i = 0; i < 500; i++) toks[i] = (i * 104729) % 128256;
    CHECK_MSG(sl_shard_write(p, toks, 500, 128256) == 0, "%s", sl_error());
    FILE *f = fopen(p, "rb");
    int32_t h[3] = {0};
    CHECK(f && fread(h, 4, 3, f) == 3);
    if (f) fclose(f);
    CHECK(h[0] == 20240801 && h[2] == 500);
    int32_t *back; size_t n;
    CHECK_MSG(sl_shard_read(p, 128256, &back, &n) == 0, "%s", sl_error());
    CHECK(n == 500 && memcmp(back, toks, sizeof toks) == 0);
    free(back);
    // The vocab check on read: with a smaller vocab the large ids are rejected.
    CHECK(sl_shard_read(p, 50257, &back, &n) == -1);
    CHECK(strstr(sl_error(), "u32.bin") && strstr(sl_error(), "50257"));
}

TEST(writer_rejects_out_of_vocab_tokens) {
    int32_t toks[3] = {1, 70000, 2};
    CHECK(sl_shard_write(tmp_path("bad_write.bin"), toks, 3, 50257) == -1);
    CHECK(strstr(sl_error(), "bad_write.bin") && strstr(sl_error(), "70000"));
    CHECK(access(tmp_path("bad_write.bin"), F_OK) != 0);  // nothing left behind
}

TEST(bad_shards_fail_with_the_file_name) {
    int32_t header[256] = {20240520, 1, 100};
    uint16_t body[100];
    for (int i = 0; i < 100; i++) body[i] = (uint16_t)i;
    int32_t *t; size_t n;

    const char *p = tmp_path("short.bin");
    write_raw(p, header, NULL, 0, 500);
    CHECK(sl_shard_read(p, 0, &t, &n) == -1 && t == NULL);
    CHECK_MSG(strstr(sl_error(), "short.bin") && strstr(sl_error(), "1024"), "%s", sl_error());

    p = tmp_path("magic.bin");
    header[0] = 12345;
    write_raw(p, header, body, sizeof body, 1024);
    CHECK(sl_shard_read(p, 0, &t, &n) == -1);
    CHECK_MSG(strstr(sl_error(), "magic.bin") && strstr(sl_error(), "12345") && strstr(sl_error(), "20240520"), "%s",
              sl_error());
    header[0] = 20240520;

    p = tmp_path("version.bin");
    header[1] = 3;
    write_raw(p, header, body, sizeof body, 1024);
    CHECK(sl_shard_read(p, 0, &t, &n) == -1);
    CHECK_MSG(strstr(sl_error(), "version.bin") && strstr(sl_error(), "version 3"), "%s", sl_error());
    header[1] = 1;

    p = tmp_path("truncated.bin");
    write_raw(p, header, body, sizeof body - 10, 1024);
    CHECK(sl_shard_read(p, 0, &t, &n) == -1);
    CHECK_MSG(strstr(sl_error(), "truncated.bin") && strstr(sl_error(), "100 tokens") && strstr(sl_error(), "1214"),
              "%s", sl_error());

    p = tmp_path("count.bin");
    header[2] = 50;  // header disagrees with the (longer) file
    write_raw(p, header, body, sizeof body, 1024);
    CHECK(sl_shard_read(p, 0, &t, &n) == -1);
    CHECK_MSG(strstr(sl_error(), "count.bin") && strstr(sl_error(), "50 tokens"), "%s", sl_error());
    header[2] = -5;
    write_raw(p, header, body, sizeof body, 1024);
    CHECK(sl_shard_read(p, 0, &t, &n) == -1);
    header[2] = 100;

    p = tmp_path("vocab.bin");
    body[42] = 60000;
    write_raw(p, header, body, sizeof body, 1024);
    CHECK(sl_shard_read(p, 0, &t, &n) == 0 && n == 100);  // vocab unknown: accepted
    free(t);
    CHECK(sl_shard_read(p, 50257, &t, &n) == -1);
    CHECK_MSG(strstr(sl_error(), "vocab.bin") && strstr(sl_error(), "token 42") && strstr(sl_error(), "60000"), "%s",
              sl_error());

    p = tmp_path("missing.bin");
    CHECK(sl_shard_read(p, 0, &t, &n) == -1);
    CHECK_MSG(strstr(sl_error(), "missing.bin") != NULL, "%s", sl_error());
    sl_shard s;
    CHECK(sl_shard_open(&s, p) == -1);
}

TEST(cleanup) {
    char cmd[600];
    if (dir[0]) { snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir); CHECK(system(cmd) == 0); }
}

TEST_MAIN()
