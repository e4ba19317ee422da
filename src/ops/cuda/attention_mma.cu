// attention_mma.cu: causal flash attention for bf16 activation storage with every tile product a PTX
// mma.sync.m16n8k16 (bf16 operands, fp32 accumulation) whose fragments stay in registers: the
// scores, the probabilities (an accumulator's layout is the next product's A-operand layout), the
// running output and its per-row rescale, and the gradients dK, dV, dQ. attention_tc.cu's WMMA kernels
// pass each product through fp32 tiles in shared memory instead (WMMA's fragment layout is
// unspecified). Deterministic: fixed loop and xor-shuffle orders, each output written by one thread.
// Exponentials are ex2.approx.ftz of log2(e)-scaled scores (one MUFU.EX2 each after a subtraction or a fused
// multiply-add, flash-attention's way, instead of expf's range reduction; within fp32 rounding of
// expf, far below the bf16 rounding of P). The backward's dS leaves out the softmax scale, which
// multiplies the fp32 sums dK and dQ once at the end instead (flash-attention 2's order: one multiply
// per output instead of one per score; the same bits where the scale is a power of two, as 1/8 at head
// dim 64, else within a bf16 rounding of dS).
// The default (SHARDLM_ATTENTION=mma) since its first GPU run (H100, 2026-11-27: GPT-2 124M B=64 attention
// forward 9.3 ms, backward 37.0 a step, against WMMA's 29.9 and 78.3); docs/gpu.md, "Attention with the
// fragments in registers (attention_mma.cu)", has the design and the numerics.
//
// Fragment layouts of mma.m16n8k16 (PTX ISA), lane = 4 * gq + tq: A (16 x 16, row-major) a0 = (gq, 2tq
// .. 2tq+1), a1 = (gq + 8, same), a2 = (gq, 2tq+8 ..), a3 = (gq + 8, 2tq+8 ..); B (16 x 8) b0 = (k 2tq ..
// 2tq+1, n gq), b1 = (k 2tq+8 .., n gq); C (16 x 8) c0, c1 = (gq, 2tq .. 2tq+1), c2, c3 = (gq + 8, same).
// A B operand whose two k-consecutive elements are adjacent in memory (K or Q rows for a product
// with a transposed tile) comes from ldmatrix (each 8x8 matrix's row r, columns 2tq.. land in lane 4r +
// tq: b0 or b1 as they are), two 8-row blocks a load; one whose k runs down a tile's rows (V, dO, Q, K
// as the right factor of P V, P^T dO, dS^T Q, dS K) comes from ldmatrix.trans; A operands of row-major
// tiles from ldmatrix too. Before 2026-11-27 (H200 probe) the first kind and the A operands were 4-byte
// shared loads, four per fragment: Nsight Compute counted them as 17% of the dK / dV kernel's
// instructions against 8% for the products (bench/gpu-runs/2026-11-27-h200/README.md).
#include "shardlm/settings.h"
#include "shardlm/attention_choice.h"
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/attention_grid.h"
#include "ops/cuda/attention_mma.cuh"
#include "ops/cuda/attention_tc_call.cuh"
extern "C" {
#include "ops/cuda/cuda_ops.h"  // cuda_attention_mma_launches
}

#include <math.h>
#include <stdint.h>

// bf16 mma.sync, ldmatrix and cp.async need sm_80 or newer (the Makefile builds sm_90 and its PTX).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "attention_mma.cu needs sm_80 or newer (bf16 mma.sync, ldmatrix, cp.async)"
#endif

namespace {

typedef __nv_bfloat16 bf16;
constexpr int TILE = 64;             // queries or keys per tile
constexpr int WARPS = 4;             // warp w owns rows 16w .. 16w+15 of the block's tile
constexpr int THREADS = WARPS * 32;
constexpr int NT = TILE / 8;         // 8-wide column blocks across a tile (n-tiles of a score product)
constexpr int KT = TILE / 16;        // 16-deep steps across a tile (k-steps of a product over a tile)
constexpr unsigned FULL = 0xffffffffu;
constexpr float LOG2E = 1.4426950408889634f;  // exponentials as ex2 of log2-scaled scores
constexpr float LN2 = 0.6931471805599453f;

template <int D> struct Geom {
    static constexpr int DS = D + 8;  // row stride (elements) of a bf16 (64, D) shared tile: rows 16-byte
                                      // aligned, 4-byte and ldmatrix reads free of bank conflicts
    static constexpr int KD = D / 16; // k-steps over the head dim
    static constexpr int ND = D / 8;  // n-tiles over the head dim (even for every D taken)
    static constexpr size_t tile = sizeof(bf16) * TILE * DS;
    static constexpr size_t forward = 5 * tile;                          // Q; K, V twice (double-buffered)
    static constexpr size_t dkdv = 6 * tile + 4 * sizeof(float) * TILE;  // K, V; Q, dO, lse, delta twice
    static constexpr size_t dq = 6 * tile;                               // Q, dO; K, V twice
    // Blocks an SM must hold (__launch_bounds__' second argument, so ptxas keeps a thread's registers
    // within 65536 / (128 blocks)): what each kernel held before the tile loads were unrolled whole
    // (2026-11-27), which hoisted address arithmetic into registers and at head dim 80 cost the dK / dV
    // kernel its third block. From head dim 96 (128 for the forward) shared memory allows no more.
    static constexpr int forward_blocks = D <= 80 ? 4 : D <= 96 ? 3 : 2;
    static constexpr int backward_blocks = D <= 80 ? 3 : 2;
};
constexpr int SS = TILE + 8;  // row stride (elements) of dS^T's tile (below; conflict-free, as DS)
// How the backward makes dQ (SHARDLM_ATTENTION_DQ): a kernel of its own (split), or inside dK / dV's kernel,
// added into fp32 sums by atomics in whatever order the key tiles come (atomic) or in key-tile order
// (ordered: each (head, query tile) passes a turn from key tile to key tile).
enum { DQ_SPLIT, DQ_ATOMIC, DQ_ORDERED };
// Those two: dK / dV's kernel also holds an iteration's dS^T (64 keys x 64 queries).
template <int D> constexpr size_t dkdv_dq_smem() { return Geom<D>::dkdv + sizeof(bf16) * TILE * SS; }
// The head dims whose dK / dV kernel takes dQ too (atomic mode): above 64 its dQ accumulator on top of
// dK and dV would not stay in registers; those head dims keep the dQ kernel.
constexpr int DQ_ATOMIC_MAX_D = 64;

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

// n bytes (16 or 4) from global src to shared dst, asynchronously (cp.async); zero-filled when !ok,
// and src is then not read.
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(ok ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(ok ? 4 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N committed groups of this thread are still in flight.
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// One step of a double-buffered loop: with more to come, queues `load_next` (the next buffer's cp.async
// copies, a statement) and waits for all but that group, else waits for everything: either way this
// thread's copies into the current buffer have landed (a barrier still has to follow). A macro, not a
// function taking a lambda: the kernels' code stays as it was measured (a lambda changed the SASS).
#define PIPELINE_STEP(more, load_next) \
    do {                               \
        if (more) {                    \
            load_next;                 \
            cp_commit();               \
            cp_wait<1>();              \
        } else {                       \
            cp_wait<0>();              \
        }                              \
    } while (0)

// 2^x: the SFU's ex2.approx with results below 2^-126 flushed to 0 (one instruction; exp2f adds a range
// test and two multiplies to return those as denormals, which no P or dS here needs: P's row sums are
// at least 1 and both are rounded to bf16 next). ex2(-inf) = 0.
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// c (16 x 8, fp32) += a (16 x 16, bf16) b (16 x 8, bf16)
__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four transposed 8x8 bf16 matrices from shared memory; lane L gives the address of row L % 8 of
// matrix L / 8. With rows r0 + (L & 15) and columns c0 + (L >> 4) * 8 of a row-major tile, r[0], r[1]
// are the B fragment (b0, b1) of the 16 x 8 block (k = rows r0.., n = columns c0..c0+7) and r[2], r[3]
// that of columns c0+8..c0+15.
__device__ __forceinline__ void ldsm_t4(uint32_t r[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p))
                 : "memory");
}

// Four 8x8 bf16 matrices from shared memory, as stored: lane L gives the address of row L % 8 of matrix
// L / 8 and receives, of matrix i, row L / 4, columns 2 (L % 4) .. +1 in r[i].
__device__ __forceinline__ void ldsm4(uint32_t r[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p))
                 : "memory");
}

// SHARDLM_ATTENTION_DQ=ordered's turns: thread 0 waits until *turn reads `want` (an acquire at GPU scope,
// so what the block that set it added before is seen), and passes it on with a release. A wait that
// outlasts 2^26 polls (some seconds) traps: a launch error instead of a silent hang, should blocks ever
// not start in index order. Not inlined: its loop cost the dK/dV kernel registers (a spill at head dim
// 64 in the heads order); it runs once an iteration, on one thread.
__device__ __noinline__ void wait_turn(const unsigned *turn, unsigned want) {
    for (unsigned polls = 0;; polls++) {
        unsigned v;
        asm volatile("ld.acquire.gpu.u32 %0, [%1];\n" : "=r"(v) : "l"(turn) : "memory");
        if (v == want) return;
        if (polls == (1u << 26)) __trap();
        __nanosleep(64);
    }
}
__device__ __forceinline__ void pass_turn(unsigned *turn, unsigned next) {
    asm volatile("st.release.gpu.u32 [%0], %1;\n" ::"l"(turn), "r"(next) : "memory");
}

// dst[0], dst[1] += x, y (8-byte aligned global fp32): one vector atomic on sm_90, two before it.
__device__ __forceinline__ void atomic_add2(float *dst, float x, float y) {
#if __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float2 *>(dst), make_float2(x, y));
#else
    atomicAdd(dst, x);
    atomicAdd(dst + 1, y);
#endif
}

// The A fragment (16 x 16) of a matrix M at rows m0 .., columns k0 .., from a shared tile that holds M^T
// row-major (row stride ld): tile rows k0 .. k0+15, columns m0 .. m0+15, transposed by ldmatrix.trans.
// Lane L addresses row L % 8 of 8x8 matrix L / 8, in a0 .. a3's order: (m 0-7, k 0-7), (m 8-15, k 0-7),
// (m 0-7, k 8-15), (m 8-15, k 8-15), i.e. tile rows k0 + 8 ((L >> 4) & 1) + L % 8, column m0 + 8 ((L >> 3) & 1).
__device__ __forceinline__ void load_a_trans(uint32_t a[4], const bf16 *tile, int ld, int k0, int m0) {
    const int lane = threadIdx.x % 32;
    ldsm_t4(a, tile + (k0 + ((lane >> 4) & 1) * 8 + (lane & 7)) * ld + m0 + ((lane >> 3) & 1) * 8);
}

// Two floats rounded to bf16 (nearest even), lo in the low half: the layout of a fragment register.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// The A fragment (16 x 16) at rows m0 .. m0+15, columns c .. c+15 of a row-major bf16 tile with row
// stride ld: matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) are a0 .. a3, so lane
// L addresses row m0 + L % 8 + 8 ((L >> 3) & 1), column c + 8 (L >> 4).
__device__ __forceinline__ void load_a(uint32_t a[4], const bf16 *tile, int ld, int m0, int c) {
    const int lane = threadIdx.x % 32;
    ldsm4(a, tile + (m0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + c + (lane >> 4) * 8);
}

// The B fragments of two 8-column blocks of a product whose B is a row-major tile transposed (B[k][n] =
// tile[n][k]): tile rows n0 .. n0+15 (n), columns c .. c+15 (k). b[0], b[1] are block n0's (b0, b1),
// b[2], b[3] block n0 + 8's: matrices (rows 0-7, cols 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15), so
// lane L addresses row n0 + L % 8 + 8 (L >> 4), column c + 8 ((L >> 3) & 1).
__device__ __forceinline__ void load_b_pair(uint32_t b[4], const bf16 *tile, int ld, int n0, int c) {
    const int lane = threadIdx.x % 32;
    ldsm4(b, tile + (n0 + (lane & 7) + (lane >> 4) * 8) * ld + c + ((lane >> 3) & 1) * 8);
}

// dst (64, D; row stride D + 8) <- rows 0..63 of the global matrix at src (row r at src + r*ld),
// asynchronously; rows at or past n_rows (>= 1) zero-filled.
// Chunk threadIdx.x + k THREADS for k < D / 16, a count known when compiled: the loop unrolls whole (a
// loop from threadIdx.x compiled to a general loop with a remainder, about a hundred instructions a
// tile, run for every Q / dO or K / V tile).
template <int D> __device__ __forceinline__ void load_tile(bf16 *dst, const bf16 *src, size_t ld, int n_rows) {
    constexpr int CH = D / 8;  // 16-byte chunks a row
    static_assert(TILE * CH % THREADS == 0, "load_tile: whole rounds of the block's threads");
#pragma unroll
    for (int k = 0; k < TILE * CH / THREADS; k++) {
        const int i = threadIdx.x + k * THREADS, r = i / CH, c = (i - r * CH) * 8;
        const bool ok = r < n_rows;
        cp_async16(dst + r * Geom<D>::DS + c, ok ? src + (size_t)r * ld + c : src, ok);
    }
}

// dst (64 floats) <- src[0..63], asynchronously (threads 0..63, one each); entries at or past n (>= 1)
// zero-filled.
__device__ __forceinline__ void load_stats(float *dst, const float *src, int n) {
    static_assert(TILE <= THREADS, "load_stats: one entry a thread");
    const int i = threadIdx.x;
    if (i < TILE) cp_async4(dst + i, i < n ? src + i : src, i < n);
}

// The four C-fragment values of an 8-column block, rounded to bf16, as the two registers an A fragment
// takes from it (frag[0..1] for an even block, frag[2..3] for an odd one): see the file comment.
__device__ __forceinline__ void to_a(uint32_t a[4], int odd, const float v[4]) {
    a[2 * odd] = pack_bf16(v[0], v[1]);
    a[2 * odd + 1] = pack_bf16(v[2], v[3]);
}

// acc (16 x D as ND fragments) += a (the 16 x 16 A fragment of one k-step) times rows r0 .. r0+15 of a
// row-major (64, D) shared tile: the B fragments from ldmatrix.trans, two 8-column blocks per load.
template <int D> __device__ __forceinline__ void mma_tile_rows(float (*acc)[4], const uint32_t a[4], const bf16 *tile,
                                                               int r0) {
    const int lane = threadIdx.x % 32;
    const bf16 *p = tile + (r0 + (lane & 15)) * Geom<D>::DS + (lane >> 4) * 8;
#pragma unroll
    for (int nd = 0; nd < Geom<D>::ND; nd += 2) {
        uint32_t b[4];
        ldsm_t4(b, p + nd * 8);
        mma(acc[nd], a, b[0], b[1]);
        mma(acc[nd + 1], a, b[2], b[3]);
    }
}

// Two score products sharing their k loop over the head dim, for the 8-row blocks nt = nt0 + n (n < N)
// of the B tiles with lo <= nt < hi (the other blocks stay 0; nt0, N, lo and hi even, so the blocks go
// in pairs): s[n] = A1's rows m0 .. m0+15 times B1's rows 8 nt .. 8 nt + 7 transposed, and t[n] the same
// for A2 and B2 (S = Q K^T with dP = dO V^T, or their transposes S^T = K Q^T with dP^T = V dO^T).
// WHOLE: every block is in range (a tile off the diagonal), and the code has no test (see mma_steps).
template <int D, int N, bool WHOLE = false>
__device__ __forceinline__ void two_scores(float (*s)[4], float (*t)[4], const bf16 *a1, const bf16 *a2,
                                           const bf16 *b1, const bf16 *b2, int m0, int nt0, int lo, int hi) {
    static_assert(N % 2 == 0, "two_scores takes its 8-row blocks in pairs");
#pragma unroll
    for (int n = 0; n < N; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[n][e] = t[n][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < Geom<D>::KD; kk++) {
        uint32_t f1[4], f2[4];
        load_a(f1, a1, Geom<D>::DS, m0, kk * 16);
        load_a(f2, a2, Geom<D>::DS, m0, kk * 16);
#pragma unroll
        for (int n = 0; n < N; n += 2) {
            const int nt = nt0 + n;
            if (!WHOLE && (nt < lo || nt >= hi)) continue;
            uint32_t x[4], y[4];
            load_b_pair(x, b1, Geom<D>::DS, nt * 8, kk * 16);
            load_b_pair(y, b2, Geom<D>::DS, nt * 8, kk * 16);
            mma(s[n], f1, x[0], x[1]);
            mma(s[n + 1], f1, x[2], x[3]);
            mma(t[n], f2, y[0], y[1]);
            mma(t[n + 1], f2, y[2], y[3]);
        }
    }
}

// acc += frags[kk] times rows 16 kk .. 16 kk + 15 of a row-major (64, D) tile, for the 16-deep steps
// kk < end (P V in the forward, dS K for dQ). WHOLE: every step (a tile off the diagonal), with no
// test in the code. The probe of 2026-11-28 (H200) found the products stalled on the ldmatrix just
// before each (short scoreboard: 23-50% of the kernels' stall samples): a test inside the unrolled
// loop puts each step's ldmatrix and products in a region of their own (a WARPSYNC before, no loads
// moved across), so off the diagonal, almost every tile, the loops run without one. The same products
// in the same order: the same bits.
template <int D, bool WHOLE>
__device__ __forceinline__ void mma_steps(float (*acc)[4], const uint32_t (*frags)[4], const bf16 *tile, int end) {
#pragma unroll
    for (int kk = 0; kk < KT; kk++)
        if (WHOLE || kk < end) mma_tile_rows<D>(acc, frags[kk], tile, kk * 16);
}

// The forward's S = Q K^T for this warp's 16 rows: qf its Q fragments (KD k-steps), Ks the key tile,
// over the 8-key blocks nt < end (in pairs: end even; the other blocks 0). WHOLE: every block, no test.
template <int D, bool WHOLE>
__device__ __forceinline__ void q_k_scores(float (*s)[4], const uint32_t (*qf)[4], const bf16 *Ks, int end) {
#pragma unroll
    for (int nt = 0; nt < NT; nt += 2) {
#pragma unroll
        for (int e = 0; e < 4; e++) s[nt][e] = s[nt + 1][e] = 0.0f;
        if (WHOLE || nt < end) {
#pragma unroll
            for (int kk = 0; kk < Geom<D>::KD; kk++) {
                uint32_t kf[4];
                load_b_pair(kf, Ks, Geom<D>::DS, nt * 8, kk * 16);
                mma(s[nt], qf[kk], kf[0], kf[1]);
                mma(s[nt + 1], qf[kk], kf[2], kf[3]);
            }
        }
    }
}

// dK / dV's products for one half (32 queries) of a query tile: dV += P^T dO and dK += dS^T Q over its
// two 16-query steps, leaving out a step whose queries all precede the warp's keys (nt_begin: only on
// the diagonal). WHOLE: no step left out, no test in the code (as mma_steps).
template <int D, bool WHOLE>
__device__ __forceinline__ void dkdv_steps(float (*dv)[4], float (*dk)[4], const uint32_t (*pf)[4],
                                           const uint32_t (*dsf)[4], const bf16 *dOs, const bf16 *Qs, int half,
                                           int nt_begin) {
#pragma unroll
    for (int kq = 0; kq < 2; kq++) {
        if (!WHOLE && 2 * (2 * half + kq) + 1 < nt_begin) continue;  // the whole 16-query step masked
        mma_tile_rows<D>(dv, pf[kq], dOs, (2 * half + kq) * 16);
        mma_tile_rows<D>(dk, dsf[kq], Qs, (2 * half + kq) * 16);
    }
}

// The K and V tiles of key tile j (kv head g of batch row base) into buffer j % 2 of KV (K, V at tiles
// 2 (j % 2) and 2 (j % 2) + 1), asynchronously.
template <int D>
__device__ __forceinline__ void load_kv(bf16 *KV, const bf16 *base, int j, size_t W, int T, int NH, int NKV, int g) {
    bf16 *dst = KV + (size_t)(2 * (j & 1)) * TILE * Geom<D>::DS;
    const bf16 *src = base + (size_t)j * TILE * W;
    load_tile<D>(dst, src + (size_t)(NH + g) * D, W, T - j * TILE);
    load_tile<D>(dst + TILE * Geom<D>::DS, src + (size_t)(NH + NKV + g) * D, W, T - j * TILE);
}

// Block blockIdx.x's unit (a head (b, h); for dK / dV a kv head (b, g)) and the rank of its tile among
// the unit's n_t, rank 0 the tile with the most work (the caller maps the rank to its tile).
// HEADS false (SHARDLM_ATTENTION_GRID=tiles, the default): rank-major, every unit's rank 0 first: the
// grid ends on short blocks, but the blocks in flight at once each belong to another unit and stream
// its K / V (Q / dO) tiles from memory, tiles that a later block of the same unit reads again.
// HEADS true (heads): attention_grid.h's chunks of `chunk` units, so the blocks in flight cover about
// one chunk, whose tiles stay in L2. A template parameter, so the default kernels compile as they did
// before the choice existed.
template <bool HEADS> __device__ __forceinline__ int block_unit(unsigned units, int n_t, unsigned chunk) {
    return HEADS ? (int)sl_grid_unit(blockIdx.x, units, (unsigned)n_t, chunk) : (int)(blockIdx.x % units);
}
template <bool HEADS> __device__ __forceinline__ int block_rank(unsigned units, int n_t, unsigned chunk) {
    return HEADS ? (int)sl_grid_rank(blockIdx.x, units, (unsigned)n_t, chunk) : (int)(blockIdx.x / units);
}

// ---- forward ----------------------------------------------------------------------------------

// One block per (b, h, query tile), longest tiles first (in block_unit / block_rank's order). Q's
// fragments are loaded once into registers; K and V tiles are double-buffered (the next one loads
// while this one is used).
template <int D, bool HEADS>
__global__ void __launch_bounds__(THREADS, Geom<D>::forward_blocks)
    mma_forward_kernel(bf16 *out, float *lse, const bf16 *qkv, int B, int T, int NH, int NKV, float scale, int n_qt,
        unsigned chunk) {
    typedef Geom<D> G;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = reinterpret_cast<bf16 *>(smem), *KV = Qs + TILE * G::DS;  // buffer i: K, V at tiles 2i, 2i+1 of KV

    const unsigned BH = (unsigned)B * (unsigned)NH;
    const int bh = block_unit<HEADS>(BH, n_qt, chunk), qt = n_qt - 1 - block_rank<HEADS>(BH, n_qt, chunk);
    const int b = bh / NH, h = bh % NH, g = h / (NH / NKV), q0 = qt * TILE;
    const size_t W = (size_t)(NH + 2 * NKV) * D;
    const bf16 *base = qkv + (size_t)b * T * W;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
    const int r0 = warp * 16 + gq;        // this lane's rows of the tile: r0 and r0 + 8
    const int qa = q0 + r0, qb = qa + 8;  // their query positions
    const float scale2 = scale * LOG2E;

    load_tile<D>(Qs, base + (size_t)q0 * W + (size_t)h * D, W, T - q0);
    load_kv<D>(KV, base, 0, W, T, NH, NKV, g);
    cp_commit();

    uint32_t qf[G::KD][4];
    float o[G::ND][4];
#pragma unroll
    for (int nd = 0; nd < G::ND; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (int j = 0; j <= qt; j++) {  // key tiles up to the diagonal
        PIPELINE_STEP(j < qt, load_kv<D>(KV, base, j + 1, W, T, NH, NKV, g));
        __syncthreads();  // tile j (and Q) landed for every thread
        if (j == 0) {
#pragma unroll
            for (int kk = 0; kk < G::KD; kk++) load_a(qf[kk], Qs, G::DS, warp * 16, kk * 16);
        }
        const bf16 *Ks = KV + (size_t)(2 * (j & 1)) * TILE * G::DS, *Vs = Ks + TILE * G::DS;
        const int k0 = j * TILE;
        const bool diag = j == qt;
        // S = Q K^T over the 8-key blocks holding a key one of this warp's rows sees (in pairs: nt_end even)
        const int nt_end = diag ? 2 * (warp + 1) : NT;
        float s[NT][4];
        if (diag) q_k_scores<D, false>(s, qf, Ks, nt_end);
        else q_k_scores<D, true>(s, qf, Ks, NT);
        // scale (in log2 units: m and the scores are log2(e) times the natural ones), causal mask (only
        // on the diagonal tile: every key of an earlier tile precedes every query of this one), the rows'
        // maxima over their 4 lanes
        float mx[2] = {-INFINITY, -INFINITY};
        if (diag) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = k0 + nt * 8 + 2 * tq + (e & 1);
                    const float v = nt < nt_end && key <= (e < 2 ? qa : qb) ? s[nt][e] * scale2 : -INFINITY;
                    s[nt][e] = v;
                    mx[e >> 1] = fmaxf(mx[e >> 1], v);
                }
        } else {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    s[nt][e] *= scale2;
                    mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
                }
        }
        float mu[2], corr[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(FULL, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(FULL, mx[i], 2));
            const float m_new = fmaxf(m[i], mx[i]);   // finite: every row sees its tile's first key
            mu[i] = m_new == -INFINITY ? 0.0f : m_new;
            corr[i] = ex2(m[i] - mu[i]);            // 0 on the first tile
            m[i] = m_new;
        }
        // P = exp(S - m) = exp2(S2 - m2), summed unrounded, rounded to bf16 straight into A fragments
        uint32_t pf[KT][4];
        float rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            float p[4];
#pragma unroll
            for (int e = 0; e < 4; e++) p[e] = ex2(s[nt][e] - mu[e >> 1]);
            rs[0] += p[0] + p[1];
            rs[1] += p[2] + p[3];
            to_a(pf[nt / 2], nt % 2, p);
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            rs[i] += __shfl_xor_sync(FULL, rs[i], 1);
            rs[i] += __shfl_xor_sync(FULL, rs[i], 2);
            l[i] = l[i] * corr[i] + rs[i];
        }
#pragma unroll
        for (int nd = 0; nd < G::ND; nd++) {
            o[nd][0] *= corr[0];
            o[nd][1] *= corr[0];
            o[nd][2] *= corr[1];
            o[nd][3] *= corr[1];
        }
        // O += P V over the 16-key steps holding a key this warp sees
        if (diag) mma_steps<D, false>(o, pf, Vs, warp + 1);
        else mma_steps<D, true>(o, pf, Vs, KT);
        __syncthreads();  // every warp is done with this buffer before tile j + 2 is loaded into it
    }
    if (tq == 0) {  // natural log-sum-exp: m2 ln 2 + ln l
        if (qa < T) lse[(size_t)bh * T + qa] = m[0] * LN2 + logf(l[0]);
        if (qb < T) lse[(size_t)bh * T + qb] = m[1] * LN2 + logf(l[1]);
    }
    const size_t WO = (size_t)NH * D;
    bf16 *dst = out + (size_t)b * T * WO + (size_t)h * D + 2 * tq;
    const float inv_a = 1.0f / l[0], inv_b = 1.0f / l[1];
#pragma unroll
    for (int nd = 0; nd < G::ND; nd++) {
        if (qa < T) *reinterpret_cast<uint32_t *>(dst + qa * WO + nd * 8) = pack_bf16(o[nd][0] * inv_a, o[nd][1] * inv_a);
        if (qb < T) *reinterpret_cast<uint32_t *>(dst + qb * WO + nd * 8) = pack_bf16(o[nd][2] * inv_b, o[nd][3] * inv_b);
    }
}

// ---- backward ---------------------------------------------------------------------------------

// dK, dV: one block per (b, kv head g, key tile), key tile 0 (the most work) first (in block_unit /
// block_rank's order); warp w owns keys 16w.. of the tile. For every query head of g's group and every
// query tile from the diagonal on (double-buffered with its dO, lse and delta): S^T = K Q^T and dP^T =
// V dO^T, P^T = exp(S^T scale - lse), dS^T = P^T (dP^T - delta), dV += P^T dO, dK += dS^T Q (times the
// scale when stored). A
// query tile goes in two halves of 32 queries, which keeps the live fragments within the register file
// at D = 128.
// DQ (SHARDLM_ATTENTION_DQ=atomic or ordered): the block also adds this key tile's share of dQ, dS K, for every
// query tile it meets: each warp stores its rows of dS^T (as bf16, the values dK's product takes) into
// shared memory, then warp w takes queries 16w.. of the tile, dQ rows (16 x D) = dS (16 x 64 keys) K,
// A from dS^T by ldmatrix.trans, and adds them into dq_acc (fp32, (B*T, NH, D)) with vector atomics.
// atomic: the key tiles' shares then land in whatever order the blocks run, so dQ is not
// bit-reproducible. ordered: before adding its share of query tile qt of head h, the block for key tile
// kt waits until that tile's turn (dq_turn[(b NH + h) n_t + qt], zeroed before the launch) reads kt,
// and sets it to kt + 1 once its adds are performed: each dQ sum takes its shares in key-tile order,
// the same bits every run. No deadlock, provided blocks start in the order of their index (as the GPU's
// block scheduler hands them out; flash-attention 3's deterministic backward relies on the same): key
// tile kt - 1 of the same unit has a smaller index in both block orders, so it has started, and it
// waits only on smaller indices in turn.
// The dQ kernel (three products a tile pair: S, dP again, dS K) is not needed; here one product is added.
template <int D, bool HEADS, int DQ>
__global__ void __launch_bounds__(THREADS, Geom<D>::backward_blocks)
    mma_dkdv_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse, const float *delta, int B, int T,
        int NH, int NKV, float scale, int n_t, unsigned chunk, float *dq_acc, unsigned *dq_turn) {
    typedef Geom<D> G;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Ks = reinterpret_cast<bf16 *>(smem), *Vs = Ks + TILE * G::DS;
    bf16 *QO = Vs + TILE * G::DS;                                          // buffer i: Q, dO at tiles 2i, 2i+1
    float *stats = reinterpret_cast<float *>(QO + 4 * TILE * G::DS);      // buffer i: lse, delta at 2i, 2i+1
    bf16 *dSt = reinterpret_cast<bf16 *>(stats + 4 * TILE);              // DQ: dS^T (64 keys x 64 queries)

    const unsigned BG = (unsigned)B * (unsigned)NKV;
    const int bg = block_unit<HEADS>(BG, n_t, chunk), kt = block_rank<HEADS>(BG, n_t, chunk);
    const int b = bg / NKV, g = bg % NKV, k0 = kt * TILE, group = NH / NKV;
    const size_t W = (size_t)(NH + 2 * NKV) * D, WO = (size_t)NH * D;
    const bf16 *base = qkv + (size_t)b * T * W;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
    const int r0 = warp * 16 + gq;        // this lane's key rows: r0 and r0 + 8
    const int ka = k0 + r0, kb = ka + 8;
    const float scale2 = scale * LOG2E;
    const int n_q = n_t - kt;             // query tiles per head, from the diagonal on
    const int n_iter = group * n_q;

    // iteration it: query head g * group + it / n_q, query tile kt + it % n_q, kept as counters (hi, qi)
    // stepped once an iteration (an integer division costs some twenty instructions)
    auto load_q = [&](int it, int hi, int qi) {
        const int h = g * group + hi, q0 = (kt + qi) * TILE;
        bf16 *dst = QO + (size_t)(2 * (it & 1)) * TILE * G::DS;
        load_tile<D>(dst, base + (size_t)q0 * W + (size_t)h * D, W, T - q0);
        load_tile<D>(dst + TILE * G::DS, dout + ((size_t)b * T + q0) * WO + (size_t)h * D, WO, T - q0);
        float *st = stats + 2 * (it & 1) * TILE;
        const size_t row = ((size_t)b * NH + h) * T + q0;
        load_stats(st, lse + row, T - q0);
        load_stats(st + TILE, delta + row, T - q0);
    };
    load_tile<D>(Ks, base + (size_t)k0 * W + (size_t)(NH + g) * D, W, T - k0);
    load_tile<D>(Vs, base + (size_t)k0 * W + (size_t)(NH + NKV + g) * D, W, T - k0);
    load_q(0, 0, 0);
    cp_commit();

    float dk[G::ND][4], dv[G::ND][4];
#pragma unroll
    for (int nd = 0; nd < G::ND; nd++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[nd][e] = dv[nd][e] = 0.0f;

    for (int it = 0, hi = 0, qi = 0; it < n_iter; it++) {
        const int hi_next = qi + 1 == n_q ? hi + 1 : hi, qi_next = qi + 1 == n_q ? 0 : qi + 1;
        PIPELINE_STEP(it + 1 < n_iter, load_q(it + 1, hi_next, qi_next));
        __syncthreads();
        const int q0 = (kt + qi) * TILE;
        const bf16 *Qs = QO + (size_t)(2 * (it & 1)) * TILE * G::DS, *dOs = Qs + TILE * G::DS;
        const float *lse_s = stats + 2 * (it & 1) * TILE, *delta_s = lse_s + TILE;
        // on the diagonal, queries before this warp's first key are masked for all its rows; below it, in
        // a query tile that ends before T, nothing is (every query follows every key of the tile)
        const int nt_begin = q0 == k0 ? 2 * warp : 0;
        const bool full = q0 != k0 && q0 + TILE <= T;
#pragma unroll
        for (int half = 0; half < 2; half++) {  // queries 32*half .. 32*half+31: n-tiles 4*half ..
            if (4 * half + 3 < nt_begin) {
                if constexpr (DQ != DQ_SPLIT) {  // this warp's rows of the half are all masked: zeros for dQ
#pragma unroll
                    for (int n = 0; n < 4; n++) {
                        const int c = (4 * half + n) * 8 + 2 * tq;
                        *reinterpret_cast<uint32_t *>(dSt + r0 * SS + c) = 0u;
                        *reinterpret_cast<uint32_t *>(dSt + (r0 + 8) * SS + c) = 0u;
                    }
                }
                continue;
            }
            float s[4][4], dp[4][4];  // S^T = K Q^T, dP^T = V dO^T
            if (q0 == k0) two_scores<D, 4>(s, dp, Ks, Vs, Qs, dOs, warp * 16, 4 * half, nt_begin, NT);
            else two_scores<D, 4, true>(s, dp, Ks, Vs, Qs, dOs, warp * 16, 4 * half, 0, NT);
            uint32_t pf[2][4], dsf[2][4];  // A fragments over this half's two 16-query steps
#pragma unroll
            for (int n = 0; n < 4; n++) {
                const int nt = 4 * half + n;
                float p[4], ds[4];
                // the lse and delta of this lane's two queries (columns c, c + 1: one 8-byte load each)
                const int c = nt * 8 + 2 * tq;
                const float2 ls = *reinterpret_cast<const float2 *>(lse_s + c);
                const float2 dl = *reinterpret_cast<const float2 *>(delta_s + c);
                const float l2[2] = {ls.x * LOG2E, ls.y * LOG2E}, dd[2] = {dl.x, dl.y};
                if (full) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        p[e] = ex2(s[n][e] * scale2 - l2[e & 1]);
                        ds[e] = p[e] * (dp[n][e] - dd[e & 1]);
                    }
                } else {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int qq = q0 + c + (e & 1);
                        p[e] = ds[e] = 0.0f;
                        if (nt >= nt_begin && qq >= (e < 2 ? ka : kb) && qq < T) {  // causal: key at or before query
                            p[e] = ex2(s[n][e] * scale2 - l2[e & 1]);
                            ds[e] = p[e] * (dp[n][e] - dd[e & 1]);
                        }
                    }
                }
                to_a(pf[n / 2], n % 2, p);
                to_a(dsf[n / 2], n % 2, ds);
                if constexpr (DQ != DQ_SPLIT) {  // rows r0, r0 + 8 of dS^T, columns c, c + 1: the pairs just made
                    *reinterpret_cast<uint32_t *>(dSt + r0 * SS + c) = dsf[n / 2][2 * (n % 2)];
                    *reinterpret_cast<uint32_t *>(dSt + (r0 + 8) * SS + c) = dsf[n / 2][2 * (n % 2) + 1];
                }
            }
            if (q0 == k0) dkdv_steps<D, false>(dv, dk, pf, dsf, dOs, Qs, half, nt_begin);
            else dkdv_steps<D, true>(dv, dk, pf, dsf, dOs, Qs, half, 0);
        }
        if constexpr (DQ != DQ_SPLIT) {
            __syncthreads();  // dS^T complete
            // warp w: queries 16w .. 16w+15 of the tile; on the diagonal their keys end at 16w + 15
            const int h = g * group + hi, kk_end = q0 == k0 ? warp + 1 : KT;
            float dq[G::ND][4];
#pragma unroll
            for (int nd = 0; nd < G::ND; nd++) dq[nd][0] = dq[nd][1] = dq[nd][2] = dq[nd][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KT; kk++) {
                if (kk >= kk_end) continue;
                uint32_t a[4];  // dS (16 queries x 16 keys) from dS^T
                load_a_trans(a, dSt, SS, kk * 16, warp * 16);
                mma_tile_rows<D>(dq, a, Ks, kk * 16);
            }
            const int qa = q0 + warp * 16 + gq, qb = qa + 8;
            float *dst = dq_acc + ((size_t)b * T * NH + h) * D + 2 * tq;  // row q at + q * NH * D
            unsigned *turn = nullptr;
            if constexpr (DQ == DQ_ORDERED) {  // key tile kt's turn at this query tile
                turn = dq_turn + ((size_t)b * NH + h) * n_t + q0 / TILE;
                if (threadIdx.x == 0) wait_turn(turn, (unsigned)kt);
                __syncthreads();
            }
#pragma unroll
            for (int nd = 0; nd < G::ND; nd++) {
                if (qa < T) atomic_add2(dst + (size_t)qa * NH * D + nd * 8, dq[nd][0] * scale, dq[nd][1] * scale);
                if (qb < T) atomic_add2(dst + (size_t)qb * NH * D + nd * 8, dq[nd][2] * scale, dq[nd][3] * scale);
            }
            if constexpr (DQ == DQ_ORDERED) {  // every thread's adds performed, then the next key tile's turn
                __threadfence();
                __syncthreads();
                if (threadIdx.x == 0) pass_turn(turn, (unsigned)kt + 1);
            }
        }
        __syncthreads();  // every warp is done with this buffer (and dS^T) before the next loads into it
        hi = hi_next;
        qi = qi_next;
    }
    bf16 *dst = dqkv + (size_t)b * T * W + (size_t)(NH + g) * D + 2 * tq;  // dK; dV at + NKV * D
#pragma unroll
    for (int nd = 0; nd < G::ND; nd++) {
        if (ka < T) {
            *reinterpret_cast<uint32_t *>(dst + ka * W + nd * 8) = pack_bf16(dk[nd][0] * scale, dk[nd][1] * scale);
            *reinterpret_cast<uint32_t *>(dst + ka * W + (size_t)NKV * D + nd * 8) = pack_bf16(dv[nd][0], dv[nd][1]);
        }
        if (kb < T) {
            *reinterpret_cast<uint32_t *>(dst + kb * W + nd * 8) = pack_bf16(dk[nd][2] * scale, dk[nd][3] * scale);
            *reinterpret_cast<uint32_t *>(dst + kb * W + (size_t)NKV * D + nd * 8) = pack_bf16(dv[nd][2], dv[nd][3]);
        }
    }
}

// dQ: one block per (b, h, query tile), longest first (in block_unit / block_rank's order); K and V
// tiles double-buffered up to the diagonal: S = Q K^T and dP = dO V^T again, dS = P (dP - delta),
// dQ += dS K (times the scale when stored).
template <int D, bool HEADS>
__global__ void __launch_bounds__(THREADS, Geom<D>::backward_blocks)
    mma_dq_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse, const float *delta, int B, int T,
        int NH, int NKV, float scale, int n_qt, unsigned chunk) {
    typedef Geom<D> G;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = reinterpret_cast<bf16 *>(smem), *dOs = Qs + TILE * G::DS, *KV = dOs + TILE * G::DS;

    const unsigned BH = (unsigned)B * (unsigned)NH;
    const int bh = block_unit<HEADS>(BH, n_qt, chunk), qt = n_qt - 1 - block_rank<HEADS>(BH, n_qt, chunk);
    const int b = bh / NH, h = bh % NH, g = h / (NH / NKV), q0 = qt * TILE;
    const size_t W = (size_t)(NH + 2 * NKV) * D, WO = (size_t)NH * D;
    const bf16 *base = qkv + (size_t)b * T * W;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
    const int r0 = warp * 16 + gq;
    const int qa = q0 + r0, qb = qa + 8;
    const float scale2 = scale * LOG2E;  // scores and lse in log2 units: p = exp2(s scale log2 e - lse log2 e)
    const float lse_a = qa < T ? lse[(size_t)bh * T + qa] * LOG2E : 0.0f;
    const float lse_b = qb < T ? lse[(size_t)bh * T + qb] * LOG2E : 0.0f;
    const float dl_a = qa < T ? delta[(size_t)bh * T + qa] : 0.0f, dl_b = qb < T ? delta[(size_t)bh * T + qb] : 0.0f;

    load_tile<D>(Qs, base + (size_t)q0 * W + (size_t)h * D, W, T - q0);
    load_tile<D>(dOs, dout + ((size_t)b * T + q0) * WO + (size_t)h * D, WO, T - q0);
    load_kv<D>(KV, base, 0, W, T, NH, NKV, g);
    cp_commit();

    float dq[G::ND][4];
#pragma unroll
    for (int nd = 0; nd < G::ND; nd++) dq[nd][0] = dq[nd][1] = dq[nd][2] = dq[nd][3] = 0.0f;

    for (int j = 0; j <= qt; j++) {
        PIPELINE_STEP(j < qt, load_kv<D>(KV, base, j + 1, W, T, NH, NKV, g));
        __syncthreads();
        const bf16 *Ks = KV + (size_t)(2 * (j & 1)) * TILE * G::DS, *Vs = Ks + TILE * G::DS;
        const int k0 = j * TILE;
        const bool diag = j == qt;
        const int nt_end = diag ? 2 * (warp + 1) : NT;
        float s[NT][4], dp[NT][4];  // S = Q K^T, dP = dO V^T
        if (diag) two_scores<D, NT>(s, dp, Qs, dOs, Ks, Vs, warp * 16, 0, 0, nt_end);
        else two_scores<D, NT, true>(s, dp, Qs, dOs, Ks, Vs, warp * 16, 0, 0, NT);
        uint32_t dsf[KT][4];
        const bool full = !diag && q0 + TILE <= T;  // no key masked for any row (every key precedes them)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            float ds[4];
            if (full) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float p = ex2(s[nt][e] * scale2 - (e < 2 ? lse_a : lse_b));
                    ds[e] = p * (dp[nt][e] - (e < 2 ? dl_a : dl_b));
                }
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = k0 + nt * 8 + 2 * tq + (e & 1), q = e < 2 ? qa : qb;
                    ds[e] = 0.0f;
                    if (nt < nt_end && key <= q && q < T) {
                        const float p = ex2(s[nt][e] * scale2 - (e < 2 ? lse_a : lse_b));
                        ds[e] = p * (dp[nt][e] - (e < 2 ? dl_a : dl_b));
                    }
                }
            }
            to_a(dsf[nt / 2], nt % 2, ds);
        }
        if (diag) mma_steps<D, false>(dq, dsf, Ks, warp + 1);
        else mma_steps<D, true>(dq, dsf, Ks, KT);
        __syncthreads();
    }
    bf16 *dst = dqkv + (size_t)b * T * W + (size_t)h * D + 2 * tq;
#pragma unroll
    for (int nd = 0; nd < G::ND; nd++) {
        if (qa < T)
            *reinterpret_cast<uint32_t *>(dst + qa * W + nd * 8) = pack_bf16(dq[nd][0] * scale, dq[nd][1] * scale);
        if (qb < T)
            *reinterpret_cast<uint32_t *>(dst + qb * W + nd * 8) = pack_bf16(dq[nd][2] * scale, dq[nd][3] * scale);
    }
}

// ---- host side --------------------------------------------------------------------------------

unsigned long launches;  // calls whose kernels were queued (cuda_attention_mma_launches); one host thread

// attention_grid.h's L2 share on the backend's GPU (the device properties it read at init; the 8 MiB
// default before it).
size_t grid_share() {
    const cudaDeviceProp *p = sl_cuda_device_props();
    return sl_grid_l2_share(p && p->l2CacheSize > 0 ? (size_t)p->l2CacheSize : 0);
}

// The launches: a grid or shared-memory limit is recorded as the op's failure (nothing queued, not counted).
template <int D, bool HEADS>
void launch_forward_in(bf16 *out, float *lse, const bf16 *qkv, int B, int T, int NH, int NKV, float scale) {
    const int n_qt = (T + TILE - 1) / TILE;
    const size_t blocks = (size_t)n_qt * B * NH;
    auto kernel = mma_forward_kernel<D, HEADS>;
    if (!sl_cuda_grid_ok(blocks, "cuda_attention_forward") || !sl_cuda_allow_smem(kernel, Geom<D>::forward)) return;
    const unsigned chunk = HEADS ? sl_grid_chunk_q(B, T, NH, NKV, D, grid_share()) : 1u;  // unused by tiles
    kernel<<<(unsigned)blocks, THREADS, Geom<D>::forward, sl_cuda_stream()>>>(out, lse, qkv, B, T, NH, NKV, scale, n_qt,
                                                                              chunk);
    CUDA_LAUNCH_CHECK();
    launches++;
}

// dQ's fp32 accumulator of SHARDLM_ATTENTION_DQ=atomic / ordered ((B*T, NH, D)) and ordered's turns (one
// per (b, h, query tile)): grow-only scratch.
sl_cuda_scratch dq_acc_buf, dq_turn_buf;

// dqkv's dQ columns (row r: NH * D values from column 0, rows W apart) <- acc (rows of NH * D floats),
// rounded to bf16; two values a thread.
__global__ void dq_from_acc_kernel(bf16 *dqkv, const float *acc, size_t rows, int width, size_t W) {
    const size_t pairs = rows * (size_t)(width / 2);
    GRID_STRIDE(i, pairs) {
        const size_t r = i / (size_t)(width / 2), c = 2 * (i - r * (size_t)(width / 2));
        const float2 v = *reinterpret_cast<const float2 *>(acc + r * (size_t)width + c);
        *reinterpret_cast<uint32_t *>(dqkv + r * W + c) = pack_bf16(v.x, v.y);
    }
}

template <int D, bool HEADS>
void launch_backward_in(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse, const float *delta, int B,
                        int T, int NH, int NKV, float scale) {
    const int n_t = (T + TILE - 1) / TILE;
    const size_t kv_blocks = (size_t)n_t * B * NKV, q_blocks = (size_t)n_t * B * NH;
    const unsigned kv_chunk = HEADS ? sl_grid_chunk_kv(B, T, NH, NKV, D, grid_share()) : 1u;  // attention_grid.h
    const int dq_mode = sl_settings_get()->attention_dq;
    if constexpr (D <= DQ_ATOMIC_MAX_D) {
        if (dq_mode == SL_ATTENTION_DQ_ATOMIC || dq_mode == SL_ATTENTION_DQ_ORDERED) {
            // dK, dV and dQ in one kernel: dQ summed in fp32 by atomics (in key-tile order when ordered),
            // then rounded into dqkv
            const bool ordered = dq_mode == SL_ATTENTION_DQ_ORDERED;
            auto dkdv = ordered ? mma_dkdv_kernel<D, HEADS, DQ_ORDERED> : mma_dkdv_kernel<D, HEADS, DQ_ATOMIC>;
            const size_t rows = (size_t)B * T, width = (size_t)NH * D, W = (size_t)(NH + 2 * NKV) * D;
            if (!sl_cuda_grid_ok(kv_blocks, "cuda_attention_backward") || !sl_cuda_allow_smem(dkdv, dkdv_dq_smem<D>()))
                return;
            float *acc = (float *)sl_cuda_scratch_get(&dq_acc_buf, sizeof(float) * rows * width, "attention dQ sums");
            if (!acc) return;
            CUDA_CHECK(cudaMemsetAsync(acc, 0, sizeof(float) * rows * width, sl_cuda_stream()));
            unsigned *turns = nullptr;
            if (ordered) {
                const size_t n_turns = (size_t)B * NH * n_t;
                turns = (unsigned *)sl_cuda_scratch_get(&dq_turn_buf, sizeof(unsigned) * n_turns, "attention dQ turns");
                if (!turns) return;
                CUDA_CHECK(cudaMemsetAsync(turns, 0, sizeof(unsigned) * n_turns, sl_cuda_stream()));
            }
            dkdv<<<(unsigned)kv_blocks, THREADS, dkdv_dq_smem<D>(), sl_cuda_stream()>>>(
                dqkv, dout, qkv, lse, delta, B, T, NH, NKV, scale, n_t, kv_chunk, acc, turns);
            CUDA_LAUNCH_CHECK();
            dq_from_acc_kernel<<<ew_grid(rows * width / 2), EW_THREADS, 0, sl_cuda_stream()>>>(dqkv, acc, rows,
                                                                                            (int)width, W);
            CUDA_LAUNCH_CHECK();
            launches++;
            return;
        }
    }
    auto dkdv = mma_dkdv_kernel<D, HEADS, DQ_SPLIT>;
    auto dq = mma_dq_kernel<D, HEADS>;
    if (!sl_cuda_grid_ok(q_blocks, "cuda_attention_backward") || !sl_cuda_allow_smem(dkdv, Geom<D>::dkdv) ||
        !sl_cuda_allow_smem(dq, Geom<D>::dq))
        return;
    const unsigned q_chunk = HEADS ? sl_grid_chunk_q(B, T, NH, NKV, D, grid_share()) : 1u;
    dkdv<<<(unsigned)kv_blocks, THREADS, Geom<D>::dkdv, sl_cuda_stream()>>>(dqkv, dout, qkv, lse, delta, B, T, NH, NKV,
                                                                            scale, n_t, kv_chunk, nullptr, nullptr);
    CUDA_LAUNCH_CHECK();
    dq<<<(unsigned)q_blocks, THREADS, Geom<D>::dq, sl_cuda_stream()>>>(dqkv, dout, qkv, lse, delta, B, T, NH, NKV,
                                                                       scale, n_t, q_chunk);
    CUDA_LAUNCH_CHECK();
    launches++;
}

// SHARDLM_ATTENTION_GRID (block_unit, block_rank) picks the instances.
bool by_head() { return sl_settings_get()->attention_grid == SL_ATTENTION_GRID_HEADS; }
template <int D>
void launch_forward(bf16 *out, float *lse, const bf16 *qkv, int B, int T, int NH, int NKV, float scale) {
    if (by_head()) launch_forward_in<D, true>(out, lse, qkv, B, T, NH, NKV, scale);
    else launch_forward_in<D, false>(out, lse, qkv, B, T, NH, NKV, scale);
}
template <int D>
void launch_backward(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse, const float *delta, int B,
                     int T, int NH, int NKV, float scale) {
    if (by_head()) launch_backward_in<D, true>(dqkv, dout, qkv, lse, delta, B, T, NH, NKV, scale);
    else launch_backward_in<D, false>(dqkv, dout, qkv, lse, delta, B, T, NH, NKV, scale);
}

// SHARDLM_ATTENTION=mma picks these kernels, and auto outside training; under cudnn (auto in training)
// they take the calls cuDNN's path does not (attention_cudnn.cuh).
bool mma_enabled() {
    const int a = sl_attention_kind();
    return a == SL_ATTENTION_MMA || a == SL_ATTENTION_CUDNN;
}

}  // namespace

extern "C" unsigned long cuda_attention_mma_launches(void) { return launches; }
extern "C" size_t cuda_attention_grid_share(void) { return grid_share(); }

bool attention_mma_forward(bf16 *out, float *lse, const bf16 *qkv, int B, int T, int NH, int NKV, int HD,
                           float scale) {
    if (!mma_enabled() || !att_tc_head_dim(HD) || !att_tc_smem_fits<Geom>(HD, false) || !att_tc_aligned16(out) ||
        !att_tc_aligned16(qkv))
        return false;
    ATT_TC_DISPATCH(HD, launch_forward, out, lse, qkv, B, T, NH, NKV, scale);
    return true;
}

bool attention_mma_backward(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse, const float *delta,
                            int B, int T, int NH, int NKV, int HD, float scale) {
    if (!mma_enabled() || !att_tc_head_dim(HD) || !att_tc_smem_fits<Geom>(HD, true) || !att_tc_aligned16(dqkv) ||
        !att_tc_aligned16(dout) || !att_tc_aligned16(qkv))
        return false;
    ATT_TC_DISPATCH(HD, launch_backward, dqkv, dout, qkv, lse, delta, B, T, NH, NKV, scale);
    return true;
}
