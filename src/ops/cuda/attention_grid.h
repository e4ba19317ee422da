// attention_grid.h: the block order of the mma.sync attention kernels (attention_mma.cu) under
// SHARDLM_ATTENTION_GRID=heads, in plain C so that tests/unit/test_attention_grid.c checks it on the CPU.
// A kernel's grid is units * n_t blocks: a unit is a head (b, h) for the forward and dQ kernels, a kv
// head (b, g) for dK / dV; its n_t blocks are its tiles, ranked 0 (the most work) to n_t - 1.
// The units go in chunks of `chunk`, one chunk's blocks after another; inside a chunk every unit's
// rank 0 first, then every unit's rank 1, and so on (the last chunk holds what is left). So the blocks
// in flight at once cover about one chunk, whose K / V (Q / dO) tiles stay in L2 while its blocks read
// them again, and the grid, like each chunk, ends on its shortest blocks. sl_grid_chunk sizes a chunk
// to fit a share of the GPU's L2 (sl_grid_l2_share). Both functions are a bijection from
// 0 .. units * n_t - 1 onto (unit, rank).
#ifndef SHARDLM_ATTENTION_GRID_H
#define SHARDLM_ATTENTION_GRID_H

#include <stddef.h>

#ifdef __CUDACC__
#define SL_GRID_FN static __host__ __device__ __forceinline__
#else
#define SL_GRID_FN static inline
#endif

// Block x's unit and rank (x < units * n_t, chunk >= 1).
SL_GRID_FN unsigned sl_grid_unit(unsigned x, unsigned units, unsigned n_t, unsigned chunk) {
    const unsigned per = chunk * n_t, c = x / per, first = c * chunk;
    const unsigned width = units - first < chunk ? units - first : chunk;
    return first + (x - c * per) % width;
}
SL_GRID_FN unsigned sl_grid_rank(unsigned x, unsigned units, unsigned n_t, unsigned chunk) {
    const unsigned per = chunk * n_t, c = x / per, first = c * chunk;
    const unsigned width = units - first < chunk ? units - first : chunk;
    return (x - c * per) / width;
}

// The L2 share a chunk's tiles may take: a sixth of the GPU's L2 (8.3 MB of an H100's 50 MB), as the
// blocks in flight span about one chunk, two across a chunk's end; at least 1 MiB; 8 MiB where the L2
// size is not known (0).
SL_GRID_FN size_t sl_grid_l2_share(size_t l2_bytes) {
    if (!l2_bytes) return (size_t)8 << 20;
    return l2_bytes / 6 > ((size_t)1 << 20) ? l2_bytes / 6 : (size_t)1 << 20;
}

// Units a chunk: as many as `share` holds at unit_bytes each (the tiles a unit's blocks read), at most
// units, and at least 1 (units 0 included).
SL_GRID_FN unsigned sl_grid_chunk(size_t unit_bytes, unsigned units, size_t share) {
    size_t c = unit_bytes ? share / unit_bytes : units;
    if (c > units) c = units;
    return c < 1 ? 1u : (unsigned)c;
}

// The chunks of attention_mma.cu's kernels (bf16 rows, 2 bytes an element; head_dim D). The forward and
// dQ go over B * NH query heads, each re-reading T rows of its kv head's K and V; the NH / NKV
// consecutive query heads of a group read the same K and V, so a chunk is a whole number of groups, as
// many as the share holds at one kv head's K and V each (at least one group, at most every head).
// dK / dV go over B * NKV kv heads, each re-reading T rows of its group's Q and dO and their lse and
// delta (fp32).
SL_GRID_FN unsigned sl_grid_chunk_q(int B, int T, int NH, int NKV, int D, size_t share) {
    const unsigned group = (unsigned)(NH / NKV), kv_units = (unsigned)B * (unsigned)NKV;
    return sl_grid_chunk((size_t)T * 2 * D * 2, kv_units, share) * group;
}
SL_GRID_FN unsigned sl_grid_chunk_kv(int B, int T, int NH, int NKV, int D, size_t share) {
    return sl_grid_chunk((size_t)T * (size_t)(NH / NKV) * (2 * (size_t)D * 2 + 2 * 4), (unsigned)B * (unsigned)NKV,
                         share);
}

#endif
