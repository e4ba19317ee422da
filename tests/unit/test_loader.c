// test_loader.c: the data loader: inputs/targets layout, sequential order without shuffle, every
// window exactly once per epoch with shuffle, determinism from the seed, disjoint rank slices
// (world 2 and 3), position save/restore through JSON, reset, and error messages.
#include "shardlm/error.h"
#include "shardlm/loader.h"
#include "shardlm/shard.h"
#include "test.h"

#include <stdint.h>

enum { B = 2, T = 8, BT = B * T, VOCAB = 50257 };
static const int shard_sizes[3] = {1001, 2000, 777};  // windows: 62 + 124 + 48 = 234
static const int total_windows = 62 + 124 + 48;
static char dir[256];

// Token i of shard s is s*5000 + i, so a window's first token says which shard and window it is.
static const char *data_dir(void) {
    if (dir[0]) return dir;
    snprintf(dir, sizeof dir, "/tmp/shardlm_test_loader_XXXXXX");
    if (!mkdtemp(dir)) { dir[0] = '\0'; return dir; }
    int32_t buf[5000];
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < shard_sizes[s]; i++) buf[i] = s * 5000 + i;
        char p[512];
        snprintf(p, sizeof p, "%s/train_%06d.bin", dir, s);
        if (sl_shard_write(p, buf, (size_t)shard_sizes[s], VOCAB) != 0) fprintf(stderr, "  %s\n", sl_error());
    }
    for (int i = 0; i < 100; i++) buf[i] = 40000 + i;
    char p[512];
    snprintf(p, sizeof p, "%s/val_000000.bin", dir);
    sl_shard_write(p, buf, 100, VOCAB);
    return dir;
}

static sl_loader_config config(int rank, int world, uint64_t seed, int shuffle) {
    return (sl_loader_config){.pattern = data_dir(), .split = "train", .micro_batch = B, .seq_len = T,
                              .rank = rank, .world = world, .seed = seed, .shuffle = shuffle, .vocab_size = VOCAB};
}

// The window id (shard * 1000 + window index) of a batch, from its first input token.
static int window_id(const int32_t *inputs) {
    int s = inputs[0] / 5000, start = inputs[0] % 5000;
    return s * 1000 + start / BT;
}

TEST(sequential_batches_and_shifted_targets) {
    sl_loader *l;
    sl_loader_config c = config(0, 1, 0, 0);
    CHECK_MSG(sl_loader_open(&l, &c) == 0, "%s", sl_error());
    if (!l) return;
    CHECK(sl_loader_num_shards(l) == 3);
    CHECK(sl_loader_num_tokens(l) == 1001 + 2000 + 777);
    CHECK(sl_loader_batches_per_epoch(l) == total_windows);
    int32_t in[BT], tg[BT];
    int ok = 1;
    for (int b = 0; b < total_windows + 3; b++) {
        CHECK(sl_loader_next(l, in, tg) == 0);
        int k = b % total_windows;
        int s = k < 62 ? 0 : k < 186 ? 1 : 2, w = k < 62 ? k : k < 186 ? k - 62 : k - 186;
        for (int i = 0; i < BT; i++) ok &= in[i] == s * 5000 + w * BT + i && tg[i] == in[i] + 1;
    }
    CHECK(ok);
    sl_loader_position pos = sl_loader_tell(l);
    CHECK(pos.epoch == 1 && pos.batch == 3 && pos.shard == 0 && pos.window == 3);
    sl_loader_reset(l);
    CHECK(sl_loader_next(l, in, tg) == 0 && in[0] == 0 && tg[BT - 1] == BT);
    sl_loader_close(l);
}

TEST(shuffle_covers_every_window_once_per_epoch_and_is_deterministic) {
    sl_loader *a, *b, *c;
    sl_loader_config ca = config(0, 1, 1234, 1), cc = config(0, 1, 99, 1);
    CHECK(sl_loader_open(&a, &ca) == 0 && sl_loader_open(&b, &ca) == 0 && sl_loader_open(&c, &cc) == 0);
    if (!a || !b || !c) return;
    static int seen[3000];
    memset(seen, 0, sizeof seen);
    int32_t in[BT], tg[BT], in2[BT], tg2[BT], in3[BT];
    int same_ab = 1, same_ac = 1, in_order = 1, first_epoch[234], same_epochs = 1;
    for (int e = 0; e < 2; e++) {
        for (int k = 0; k < total_windows; k++) {
            CHECK(sl_loader_next(a, in, tg) == 0);
            CHECK(sl_loader_next(b, in2, tg2) == 0);
            CHECK(sl_loader_next(c, in3, tg2) == 0);
            same_ab &= memcmp(in, in2, sizeof in) == 0;
            same_ac &= memcmp(in, in3, sizeof in) == 0;
            for (int i = 0; i + 1 < BT; i++) in_order &= tg[i] == in[i + 1];
            int id = window_id(in);
            if (e == 0) { seen[id]++; first_epoch[k] = id; }
            else same_epochs &= first_epoch[k] == id;
        }
    }
    int each_once = 1;
    for (int s = 0; s < 3; s++)
        for (int w = 0; w < (shard_sizes[s] - 1) / BT; w++) each_once &= seen[s * 1000 + w] == 1;
    CHECK(each_once);
    CHECK(same_ab);
    CHECK(!same_ac);       // another seed, another order
    CHECK(in_order);
    CHECK(!same_epochs);   // each epoch draws a fresh permutation
    sl_loader_close(a); sl_loader_close(b); sl_loader_close(c);
}

static void check_disjoint_ranks(int world) {
    static int owner[3000];
    for (int i = 0; i < 3000; i++) owner[i] = -1;
    int64_t per_rank = total_windows / world;
    int overlap = 0, count = 0;
    for (int r = 0; r < world; r++) {
        sl_loader *l;
        sl_loader_config c = config(r, world, 7, 1);
        CHECK_MSG(sl_loader_open(&l, &c) == 0, "%s", sl_error());
        if (!l) return;
        CHECK(sl_loader_batches_per_epoch(l) == per_rank);
        int32_t in[BT], tg[BT];
        for (int64_t k = 0; k < per_rank; k++) {
            CHECK(sl_loader_next(l, in, tg) == 0);
            int id = window_id(in);
            if (owner[id] != -1) overlap++;
            owner[id] = r;
            count++;
        }
        sl_loader_close(l);
    }
    CHECK_MSG(overlap == 0, "world %d: %d windows seen by two ranks in one epoch", world, overlap);
    CHECK(count == per_rank * world);
}

TEST(ranks_read_disjoint_windows_world2) { check_disjoint_ranks(2); }
TEST(ranks_read_disjoint_windows_world3) { check_disjoint_ranks(3); }

TEST(position_save_restore_gives_identical_batches) {
    for (int world = 1; world <= 3; world += 2) {
        sl_loader *a, *b;
        sl_loader_config c = config(world - 1, world, 42, 1);
        CHECK(sl_loader_open(&a, &c) == 0 && sl_loader_open(&b, &c) == 0);
        if (!a || !b) return;
        int32_t in[BT], tg[BT], in2[BT], tg2[BT];
        for (int k = 0; k < 100; k++) CHECK(sl_loader_next(a, in, tg) == 0);  // crosses an epoch for world 3
        sl_loader_position p = sl_loader_tell(a), q = {0};
        char json[256];
        CHECK(sl_loader_position_to_json(&p, json, sizeof json) == 0);
        CHECK_MSG(sl_loader_position_from_json(json, &q) == 0, "%s", sl_error());
        CHECK(q.epoch == p.epoch && q.batch == p.batch && q.shard == p.shard && q.window == p.window);
        CHECK_MSG(sl_loader_seek(b, &q) == 0, "%s", sl_error());
        int same = 1;
        for (int k = 0; k < 300; k++) {
            CHECK(sl_loader_next(a, in, tg) == 0 && sl_loader_next(b, in2, tg2) == 0);
            same &= memcmp(in, in2, sizeof in) == 0 && memcmp(tg, tg2, sizeof tg) == 0;
        }
        CHECK_MSG(same, "world %d: resumed loader diverged (saved %s)", world, json);
        sl_loader_close(a); sl_loader_close(b);
    }
}

TEST(val_split_and_reset) {
    sl_loader *l;
    sl_loader_config c = config(0, 1, 0, 0);
    c.split = "val";
    CHECK_MSG(sl_loader_open(&l, &c) == 0, "%s", sl_error());
    if (!l) return;
    CHECK(sl_loader_num_shards(l) == 1 && sl_loader_batches_per_epoch(l) == 6);
    int32_t in[BT], tg[BT];
    for (int k = 0; k < 4; k++) CHECK(sl_loader_next(l, in, tg) == 0);
    CHECK(in[0] == 40000 + 3 * BT);
    sl_loader_reset(l);
    CHECK(sl_loader_next(l, in, tg) == 0 && in[0] == 40000 && tg[0] == 40001);
    sl_loader_close(l);
    // A glob pattern works as well as a directory + split.
    char pat[600];
    snprintf(pat, sizeof pat, "%s/train_00000[12].bin", data_dir());
    c = config(0, 1, 0, 0);
    c.pattern = pat;
    c.split = NULL;
    CHECK_MSG(sl_loader_open(&l, &c) == 0, "%s", sl_error());
    if (l) { CHECK(sl_loader_num_shards(l) == 2); sl_loader_close(l); }
}

TEST(loader_errors) {
    sl_loader *l;
    sl_loader_config c = config(0, 1, 0, 0);
    c.split = "test";
    CHECK(sl_loader_open(&l, &c) == -1 && l == NULL);
    CHECK_MSG(strstr(sl_error(), "test_*.bin") != NULL, "%s", sl_error());
    c = config(0, 1, 0, 0);
    c.pattern = "/nonexistent/shardlm/*.bin";
    CHECK(sl_loader_open(&l, &c) == -1);
    CHECK_MSG(strstr(sl_error(), "/nonexistent/shardlm/*.bin") != NULL, "%s", sl_error());
    c = config(0, 1, 0, 0);
    c.micro_batch = 64; c.seq_len = 64;  // 4097-token windows: no shard is long enough
    CHECK(sl_loader_open(&l, &c) == -1);
    CHECK_MSG(strstr(sl_error(), "4097") != NULL, "%s", sl_error());
    c = config(3, 3, 0, 0);
    CHECK(sl_loader_open(&l, &c) == -1);
    c = config(0, 1, 0, 0);
    c.vocab_size = 1000;  // shard 1 holds ids 5000..6999: caught when its first window is read
    CHECK(sl_loader_open(&l, &c) == 0);
    if (l) {
        int32_t in[BT], tg[BT];
        int rc = 0;
        for (int k = 0; k < 100 && rc == 0; k++) rc = sl_loader_next(l, in, tg);
        CHECK_MSG(rc == -1 && strstr(sl_error(), "train_000001.bin") && strstr(sl_error(), "5000"), "%s", sl_error());
        sl_loader_position p = {0, 10000, 0, 0};
        CHECK(sl_loader_seek(l, &p) == -1);
        sl_loader_close(l);
    }
    sl_loader_position q;
    CHECK(sl_loader_position_from_json("{\"epoch\": 1}", &q) == -1);
    CHECK(sl_loader_position_from_json("not json", &q) == -1);
    // out-of-range integers are refused before any conversion (1e30 used to be cast to int64)
    CHECK(sl_loader_position_from_json("{\"epoch\": 1, \"batch\": 1e30}", &q) == -1);
    CHECK_MSG(strstr(sl_error(), "loader position: \"batch\" must be an integer in [0, 9007199254740992], found 1e+30"),
              "%s", sl_error());
    CHECK(sl_loader_position_from_json("{\"epoch\": -1, \"batch\": 0}", &q) == -1);
}

TEST(cleanup) {
    char cmd[600];
    if (dir[0]) { snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir); CHECK(system(cmd) == 0); }
}

TEST_MAIN()
