// attention_grid.h: the block order of the mma.sync attention kernels (attention_mma.cu) under
// SHARDLM_ATTENTION_GRID=heads, in plain C so that tests/unit/test_attention_grid.c checks it on the CPU.
// A kernel's grid is units * n_t blocks: a unit is a head (b, h) for the forward and dQ kernels, a kv
// head (b, g) for dK / dV; its n_t blocks are its tiles, ranked 0 (the most work) to n_t - 1.
// The units go in chunks of `chunk`, one chunk's blocks after another; inside a chunk every unit's
// rank 0 first, then every unit's rank 1, and so on (the last chunk holds what is left). So the blocks
// in flight at once cover about one chunk, whose K / V (Q / dO) tiles stay in L2 while its blocks read
// them again, and the grid, like each chunk, ends on its shortest blocks. sl_grid_chunk sizes a chunk
// to fit a share of L2. Both functions are a bijection from 0 .. units * n_t - 1 onto (unit, rank).
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

// The L2 share a chunk's tiles may take: 8 MiB, a sixth of an H100's 50 MB; the blocks in flight span
// about one chunk, two across a chunk's end (16 MiB). A fixed share, not the GPU's L2 size: on a part
// with a small L2 (3-6 MB on some sm_80+ parts) the heads order would still overflow it.
#define SL_GRID_L2_SHARE ((size_t)8 << 20)

// Units a chunk: as many as SL_GRID_L2_SHARE holds at unit_bytes each (the tiles a unit's blocks read),
// at most units, and at least 1 (units 0 included).
SL_GRID_FN unsigned sl_grid_chunk(size_t unit_bytes, unsigned units) {
    size_t c = unit_bytes ? SL_GRID_L2_SHARE / unit_bytes : units;
    if (c > units) c = units;
    return c < 1 ? 1u : (unsigned)c;
}

// The chunks of attention_mma.cu's kernels (bf16 rows, 2 bytes an element; head_dim D): the forward and
// dQ over B * NH heads, each re-reading T rows of K and V; dK / dV over B * NKV kv heads, each
// re-reading T rows of its group's Q and dO and their lse and delta (fp32).
SL_GRID_FN unsigned sl_grid_chunk_q(int B, int T, int NH, int D) {
    return sl_grid_chunk((size_t)T * 2 * D * 2, (unsigned)B * (unsigned)NH);
}
SL_GRID_FN unsigned sl_grid_chunk_kv(int B, int T, int NH, int NKV, int D) {
    return sl_grid_chunk((size_t)T * (size_t)(NH / NKV) * (2 * (size_t)D * 2 + 2 * 4), (unsigned)B * (unsigned)NKV);
}

#endif
