// test_attention_grid.c: the block order of the GPU's mma.sync attention under
// SHARDLM_ATTENTION_GRID=heads (src/ops/cuda/attention_grid.h, the functions the kernels call), on the
// CPU: every block gets one (unit, rank) and every pair one block; inside a chunk the ranks never
// decrease (the longest tiles of the chunk's units first) and each chunk's units follow the last
// one's; the grid ends on a shortest block; and the chunk sizes for GPT-2 124M's shapes.
#include "test.h"

#include <stdlib.h>
#include <string.h>

#include "ops/cuda/attention_grid.h"

// Every property above for one grid; 1 when all hold (the first broken one is reported).
static int grid_ok(unsigned units, unsigned n_t, unsigned chunk) {
    const unsigned n = units * n_t;
    unsigned char *seen = calloc(n, 1);
    int ok = seen != NULL;
    unsigned prev_unit = 0, prev_rank = 0, prev_chunk = 0;
    for (unsigned x = 0; ok && x < n; x++) {
        const unsigned u = sl_grid_unit(x, units, n_t, chunk), r = sl_grid_rank(x, units, n_t, chunk);
        const unsigned c = u / chunk;
        CHECK_MSG(u < units && r < n_t, "units %u n_t %u chunk %u: block %u -> (%u, %u)", units, n_t, chunk, x, u, r);
        if (u >= units || r >= n_t) { ok = 0; break; }
        CHECK_MSG(!seen[u * n_t + r], "units %u n_t %u chunk %u: (%u, %u) twice", units, n_t, chunk, u, r);
        ok = ok && !seen[u * n_t + r];
        seen[u * n_t + r] = 1;
        if (x > 0) {
            // chunks in order, one after another; inside one, ranks never decrease
            CHECK_MSG(c == prev_chunk || c == prev_chunk + 1, "units %u n_t %u chunk %u: block %u jumps from chunk "
                      "%u to %u", units, n_t, chunk, x, prev_chunk, c);
            CHECK_MSG(c != prev_chunk || r >= prev_rank, "units %u n_t %u chunk %u: block %u rank %u after %u",
                      units, n_t, chunk, x, r, prev_rank);
            ok = ok && (c == prev_chunk || c == prev_chunk + 1) && (c != prev_chunk || r >= prev_rank);
        }
        prev_unit = u, prev_rank = r, prev_chunk = c;
    }
    (void)prev_unit;
    if (ok) CHECK_MSG(prev_rank == n_t - 1, "units %u n_t %u chunk %u: the grid ends on rank %u", units, n_t, chunk,
                      prev_rank);
    free(seen);
    return ok && prev_rank == n_t - 1;
}

TEST(every_block_once_chunks_in_order_longest_first) {
    static const unsigned units[] = {1, 2, 3, 7, 12, 31, 96, 100, 768};
    static const unsigned tiles[] = {1, 2, 5, 16, 33};
    static const unsigned chunks[] = {1, 2, 3, 8, 32, 1000};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        for (size_t j = 0; j < sizeof tiles / sizeof tiles[0]; j++)
            for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
                const unsigned c = chunks[k] < units[i] ? chunks[k] : units[i];
                if (!grid_ok(units[i], tiles[j], c)) return;
            }
}

TEST(chunk_of_one_is_head_major) {
    // a chunk of one unit: one head's tiles after another, longest first
    for (unsigned x = 0; x < 12 * 16; x++) {
        CHECK(sl_grid_unit(x, 12, 16, 1) == x / 16);
        CHECK(sl_grid_rank(x, 12, 16, 1) == x % 16);
    }
}

TEST(a_last_partial_chunk_holds_the_rest) {
    // 10 units in chunks of 4: 4, 4, 2; the last chunk's blocks alternate between units 8 and 9
    CHECK(sl_grid_unit(2 * 4 * 3, 10, 3, 4) == 8 && sl_grid_rank(2 * 4 * 3, 10, 3, 4) == 0);
    CHECK(sl_grid_unit(2 * 4 * 3 + 1, 10, 3, 4) == 9 && sl_grid_rank(2 * 4 * 3 + 1, 10, 3, 4) == 0);
    CHECK(sl_grid_unit(10 * 3 - 1, 10, 3, 4) == 9 && sl_grid_rank(10 * 3 - 1, 10, 3, 4) == 2);
}

TEST(chunk_sizes) {
    const size_t share = (size_t)8 << 20;
    // GPT-2 124M, T = 1024, head_dim 64, B = 64: K and V rows 256 bytes, 256 KiB a head: 32 heads a chunk
    CHECK(sl_grid_chunk((size_t)1024 * 2 * 64 * 2, 64 * 12, share) == 32);
    // dK / dV's unit (one kv head of a group of 1): Q and dO rows plus lse and delta, 264 KiB: 31
    CHECK(sl_grid_chunk((size_t)1024 * (2 * 64 * 2 + 2 * 4), 64 * 12, share) == 31);
    CHECK(sl_grid_chunk_q(64, 1024, 12, 12, 64, share) == 32);  // the same through the kernels' helpers
    CHECK(sl_grid_chunk_kv(64, 1024, 12, 12, 64, share) == 31);
    CHECK(sl_grid_chunk_kv(2, 1024, 16, 4, 128, share) == 3);   // GQA: a kv head re-reads 4 heads' Q and dO
    CHECK(sl_grid_chunk((size_t)1 << 30, 768, share) == 1);  // a unit larger than the share: one at a time
    CHECK(sl_grid_chunk(64, 5, share) == 5);                 // never more than the units
    CHECK(sl_grid_chunk(0, 7, share) == 7);
    CHECK(sl_grid_chunk(64, 0, share) == 1);                 // never 0 (a divisor in the kernels)
}

TEST(gqa_chunks_hold_whole_groups_sized_by_kv_heads) {
    const size_t share = (size_t)8 << 20;
    // 16 query heads on 4 kv heads, head_dim 128, T = 1024: a kv head's K and V are 512 KiB, so 16 kv heads
    // fit the share, and the forward / dQ chunk is their 64 query heads (4 groups of 4 per batch row)
    CHECK(sl_grid_chunk_q(32, 1024, 16, 4, 128, share) == 64);
    // every chunk but a last one is a whole number of groups, also when one kv head exceeds the share
    for (int nkv = 1; nkv <= 16; nkv *= 2)
        for (int T = 64; T <= 65536; T *= 4) {
            const unsigned c = sl_grid_chunk_q(3, T, 16, nkv, 128, share);
            CHECK_MSG(c % (unsigned)(16 / nkv) == 0 && c >= 1 && c <= 3u * 16u, "nkv %d T %d: chunk %u", nkv, T, c);
        }
    // a group larger than the share still takes one whole group
    CHECK(sl_grid_chunk_q(2, 65536, 32, 4, 128, share) == 8);
    // no more than every head
    CHECK(sl_grid_chunk_q(1, 64, 16, 4, 64, share) == 16);
}

TEST(l2_share_is_a_sixth_of_the_gpus_l2) {
    CHECK(sl_grid_l2_share((size_t)50 << 20) == ((size_t)50 << 20) / 6);  // H100: 50 MiB
    CHECK(sl_grid_l2_share((size_t)6 << 20) == (size_t)1 << 20);          // a small L2: 1 MiB
    CHECK(sl_grid_l2_share((size_t)3 << 20) == (size_t)1 << 20);          // never below 1 MiB
    CHECK(sl_grid_l2_share(0) == (size_t)8 << 20);                        // unknown: 8 MiB
    // GPT-2 124M's forward chunk on an H100: 33 heads of 256 KiB (8.3 MiB)
    CHECK(sl_grid_chunk_q(64, 1024, 12, 12, 64, sl_grid_l2_share((size_t)50 << 20)) == 33);
}

TEST(a_chunk_larger_than_the_units_is_the_default_order) {
    // one chunk holding every unit: rank-major, every unit's rank 0 first (SHARDLM_ATTENTION_GRID=tiles)
    for (unsigned x = 0; x < 5 * 7; x++) {
        CHECK(sl_grid_unit(x, 5, 7, 9) == x % 5);
        CHECK(sl_grid_rank(x, 5, 7, 9) == x / 5);
    }
}

TEST_MAIN()
