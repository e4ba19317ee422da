// test_comm_mpi.c: the "mpi" comm backend under mpirun (tests/cli/test_comm_mpi.sh starts it with
// -np 2, 3 and 4). Every check runs on every rank; a check's failures are combined across ranks
// with an allreduce (MAX), and only rank 0 prints the "PASS npN_name" / "FAIL npN_name" line, so
// tests/run.sh counts each check once per world size. Failing ranks print details to stderr.
//
// Covered: backend selection ("auto" under mpirun) and launch-environment agreement, allreduce
// (sum/max/min x f32/f64/i32/i64), reduce_scatter and allgather (odd block sizes, ZeRO-style
// padding, in-place forms), broadcast from a non-zero root, barrier, a send/recv ring, MPI errors
// coming back as messages (truncation, short messages), non-blocking operations overlapped with
// work and completed in reverse order, the >INT_MAX path through a small forced chunk size, split,
// Megatron topologies, and byte counting.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"   // sl_comm_mpi_set_max_chunk (test hook)
#include "shardlm/comm.h"
#include "shardlm/error.h"
#include "mpi_check.h"
#include "shardlm/launch_env.h"

static sl_comm *world;

// ---- checks -------------------------------------------------------------------------------------------

static void check_world(void) {
    EXPECT(sl_comm_backend_of(world) == SL_COMM_MPI);
    EXPECT(strcmp(sl_comm_name(world), "world") == 0);
    sl_launch_env env;
    EXPECT(sl_launch_env_detect(&env) == 0);
    EXPECT(env.launcher == SL_LAUNCHER_OPENMPI);
    EXPECT(env.rank == rank && env.world_size == size);
    EXPECT(env.local_rank == rank && env.local_world_size == size && env.node_rank == 0);
    report("auto_backend_matches_launch_env");
}

static void check_allreduce(void) {
    enum { N = 1001 };
    sl_dtype dtypes[4] = {SL_DTYPE_F32, SL_DTYPE_F64, SL_DTYPE_I32, SL_DTYPE_I64};
    sl_reduce_op ops[3] = {SL_OP_SUM, SL_OP_MAX, SL_OP_MIN};
    const char *names[4][3] = {{"allreduce_sum_f32", "allreduce_max_f32", "allreduce_min_f32"},
                               {"allreduce_sum_f64", "allreduce_max_f64", "allreduce_min_f64"},
                               {"allreduce_sum_i32", "allreduce_max_i32", "allreduce_min_i32"},
                               {"allreduce_sum_i64", "allreduce_max_i64", "allreduce_min_i64"}};
    for (int d = 0; d < 4; d++) {
        for (int o = 0; o < 3; o++) {
            union {
                float f[N];
                double g[N];
                int32_t i[N];
                int64_t l[N];
            } u;
            for (size_t i = 0; i < N; i++) {
                int64_t v = val(rank, i);
                if (d == 0) u.f[i] = (float)v;
                if (d == 1) u.g[i] = (double)v;
                if (d == 2) u.i[i] = (int32_t)v;
                if (d == 3) u.l[i] = v;
            }
            EXPECT(sl_comm_allreduce(world, &u, N, dtypes[d], ops[o]) == 0);
            int bad = 0;
            for (size_t i = 0; i < N; i++) {
                int64_t want = val(0, i);
                for (int r = 1; r < size; r++) {
                    int64_t v = val(r, i);
                    if (o == 0) want += v;
                    if (o == 1 && v > want) want = v;
                    if (o == 2 && v < want) want = v;
                }
                double got = d == 0 ? u.f[i] : d == 1 ? u.g[i] : d == 2 ? (double)u.i[i] : (double)u.l[i];
                bad += got != (double)want;
            }
            EXPECT(bad == 0);
            report(names[d][o]);
        }
    }
}

// Block sizes that do not divide evenly: recv_count per rank, the input padded to size * recv_count.
static void check_reduce_scatter_allgather(void) {
    size_t total = 10 * (size_t)size + 3;                     // not a multiple of size
    size_t shard = (total + (size_t)size - 1) / (size_t)size;   // ZeRO's padded shard
    float *grads = calloc(shard * (size_t)size, sizeof(float));
    float *mine = calloc(shard, sizeof(float));
    float *full = calloc(shard * (size_t)size, sizeof(float));
    for (size_t i = 0; i < total; i++) grads[i] = (float)val(rank, i);
    EXPECT(sl_comm_reduce_scatter(world, grads, mine, shard, SL_DTYPE_F32, SL_OP_SUM) == 0);
    int bad = 0;
    for (size_t k = 0; k < shard; k++) {
        size_t i = (size_t)rank * shard + k;
        float want = 0;
        if (i < total)
            for (int r = 0; r < size; r++) want += (float)val(r, i);
        bad += mine[k] != want;
    }
    EXPECT(bad == 0);
    report("reduce_scatter_padded_sum");

    EXPECT(sl_comm_allgather(world, mine, full, shard, SL_DTYPE_F32) == 0);
    bad = 0;
    for (size_t i = 0; i < shard * (size_t)size; i++) {
        float want = 0;
        if (i < total)
            for (int r = 0; r < size; r++) want += (float)val(r, i);
        bad += full[i] != want;
    }
    EXPECT(bad == 0);
    report("allgather_padded_roundtrip");

    // In place, as ZeRO does on the flat gradient buffer: this rank's block of grads gets the
    // reduction, and the other blocks are left alone.
    for (size_t i = 0; i < shard * (size_t)size; i++) grads[i] = (float)val(rank, i + 5);
    float *mine_in = grads + (size_t)rank * shard;
    EXPECT(sl_comm_reduce_scatter(world, grads, mine_in, shard, SL_DTYPE_F32, SL_OP_MAX) == 0);
    bad = 0;
    for (size_t i = 0; i < shard * (size_t)size; i++) {
        float want = (float)val(rank, i + 5);
        if (i / shard == (size_t)rank)
            for (int r = 0; r < size; r++) want = (float)val(r, i + 5) > want ? (float)val(r, i + 5) : want;
        bad += grads[i] != want;
    }
    EXPECT(bad == 0);
    report("reduce_scatter_in_place_max");

    for (size_t k = 0; k < shard; k++) mine_in[k] = (float)(rank * 100 + (int)k);
    EXPECT(sl_comm_allgather(world, mine_in, grads, shard, SL_DTYPE_F32) == 0);
    bad = 0;
    for (size_t i = 0; i < shard * (size_t)size; i++) bad += grads[i] != (float)((int)(i / shard) * 100 + (int)(i % shard));
    EXPECT(bad == 0);
    report("allgather_in_place");

    int64_t one = rank * 3 + 1, all[8] = {0};
    EXPECT(sl_comm_allgather(world, &one, all, 1, SL_DTYPE_I64) == 0);
    bad = 0;
    for (int r = 0; r < size; r++) bad += all[r] != r * 3 + 1;
    EXPECT(bad == 0);
    report("allgather_one_i64");
    free(grads);
    free(mine);
    free(full);
}

static void check_broadcast_barrier(void) {
    int root = size - 1;
    double d[17];
    uint8_t u[33];
    for (int i = 0; i < 17; i++) d[i] = rank == root ? i * 0.5 + 1 : -1;
    for (int i = 0; i < 33; i++) u[i] = rank == root ? (uint8_t)(200 + i) : 0;
    EXPECT(sl_comm_broadcast(world, d, 17, SL_DTYPE_F64, root) == 0);
    EXPECT(sl_comm_broadcast(world, u, 33, SL_DTYPE_U8, root) == 0);
    int bad = 0;
    for (int i = 0; i < 17; i++) bad += d[i] != i * 0.5 + 1;
    for (int i = 0; i < 33; i++) bad += u[i] != (uint8_t)(200 + i);
    EXPECT(bad == 0);
    report("broadcast_from_last_rank");
    EXPECT(sl_comm_barrier(world) == 0);
    EXPECT(sl_comm_barrier(world) == 0);
    report("barrier");
}

static void check_send_recv(void) {
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    int32_t out[9], in[9] = {0};
    for (int i = 0; i < 9; i++) out[i] = rank * 100 + i;
    if (rank % 2 == 0) {
        EXPECT(sl_comm_send(world, out, 9, SL_DTYPE_I32, next, 7) == 0);
        EXPECT(sl_comm_recv(world, in, 9, SL_DTYPE_I32, prev, 7) == 0);
    } else {
        EXPECT(sl_comm_recv(world, in, 9, SL_DTYPE_I32, prev, 7) == 0);
        EXPECT(sl_comm_send(world, out, 9, SL_DTYPE_I32, next, 7) == 0);
    }
    int bad = 0;
    for (int i = 0; i < 9; i++) bad += in[i] != prev * 100 + i;
    EXPECT(bad == 0);
    report("send_recv_ring");

    // Errors come back as messages, not aborts: a short message, then a truncated one.
    int32_t buf[5] = {1, 2, 3, 4, 5};
    if (rank == 0) {
        EXPECT(sl_comm_send(world, buf, 3, SL_DTYPE_I32, 1, 9) == 0);
        EXPECT(sl_comm_send(world, buf, 5, SL_DTYPE_I32, 1, 10) == 0);
    } else if (rank == 1) {
        EXPECT(sl_comm_recv(world, buf, 5, SL_DTYPE_I32, 0, 9) == -1);
        EXPECT(strstr(sl_error(), "expected 5 i32 elements from rank 0 (tag 9), got 3") != NULL);
        EXPECT(sl_comm_recv(world, buf, 3, SL_DTYPE_I32, 0, 10) == -1);
        EXPECT(strstr(sl_error(), "MPI_Recv on group world (rank 1 of") != NULL);
        EXPECT(strstr(sl_error(), "failed: ") != NULL);
    }
    EXPECT(sl_comm_send(world, buf, 1, SL_DTYPE_I32, rank, 0) == -1);   // to oneself
    EXPECT(sl_comm_broadcast(world, buf, 1, SL_DTYPE_I32, size) == -1);
    EXPECT(strstr(sl_error(), "root") != NULL);
    report("mpi_errors_are_returned");
}

static double busy_work(int n) {
    double s = 0;
    for (int i = 1; i <= n; i++) s += 1.0 / i;
    return s;
}

static void check_nonblocking(void) {
    enum { K = 4, N = 20000 };
    float *bufs[K];
    sl_comm_request req[K + 3];
    for (int k = 0; k < K; k++) {
        bufs[k] = malloc(N * sizeof(float));
        for (size_t i = 0; i < N; i++) bufs[k][i] = (float)val(rank, i + (size_t)k);
        EXPECT(sl_comm_iallreduce(world, bufs[k], N, SL_DTYPE_F32, SL_OP_SUM, &req[k]) == 0);
    }
    size_t rc_count = 7;
    float *rs_in = malloc(rc_count * (size_t)size * sizeof(float)), rs_out[7];
    for (size_t i = 0; i < rc_count * (size_t)size; i++) rs_in[i] = (float)val(rank, i);
    EXPECT(sl_comm_ireduce_scatter(world, rs_in, rs_out, rc_count, SL_DTYPE_F32, SL_OP_SUM, &req[K]) == 0);
    int64_t ag_in[3] = {rank, rank * 2, rank * 3}, ag_out[3 * 8];
    EXPECT(sl_comm_iallgather(world, ag_in, ag_out, 3, SL_DTYPE_I64, &req[K + 1]) == 0);
    double bc[5];
    for (int i = 0; i < 5; i++) bc[i] = rank == 1 ? 42.0 + i : 0;
    EXPECT(sl_comm_ibroadcast(world, bc, 5, SL_DTYPE_F64, 1, &req[K + 2]) == 0);

    volatile double sink = busy_work(200000);   // computation overlapped with communication
    (void)sink;
    int done = 0;
    for (int spin = 0; spin < 1000000 && !done; spin++) EXPECT(sl_comm_test(&req[K + 2], &done) == 0);
    EXPECT(done && req[K + 2].done && req[K + 2].impl == NULL);
    for (int k = K + 1; k >= 0; k--) EXPECT(sl_comm_wait(&req[k]) == 0);   // reverse order
    for (int k = 0; k < K + 3; k++) EXPECT(req[k].done == 1 && req[k].impl == NULL);
    EXPECT(sl_comm_wait(&req[0]) == 0);   // waiting again is harmless

    int bad = 0;
    for (int k = 0; k < K; k++)
        for (size_t i = 0; i < N; i++) {
            float want = 0;
            for (int r = 0; r < size; r++) want += (float)val(r, i + (size_t)k);
            bad += bufs[k][i] != want;
        }
    for (size_t k = 0; k < rc_count; k++) {
        float want = 0;
        for (int r = 0; r < size; r++) want += (float)val(r, (size_t)rank * rc_count + k);
        bad += rs_out[k] != want;
    }
    for (int r = 0; r < size; r++)
        for (int j = 0; j < 3; j++) bad += ag_out[r * 3 + j] != r * (j + 1);
    for (int i = 0; i < 5; i++) bad += bc[i] != 42.0 + i;
    EXPECT(bad == 0);
    report("nonblocking_overlap_reverse_wait");
    for (int k = 0; k < K; k++) free(bufs[k]);
    free(rs_in);
}

// The >INT_MAX path with small buffers: every MPI call gets at most 7 elements.
static void check_chunked(void) {
    size_t old = sl_comm_mpi_set_max_chunk(7);
    int bad = 0;
    // allreduce, blocking and non-blocking
    double ar[50], ar2[50];
    for (size_t i = 0; i < 50; i++) ar[i] = ar2[i] = (double)val(rank, i);
    EXPECT(sl_comm_allreduce(world, ar, 50, SL_DTYPE_F64, SL_OP_SUM) == 0);
    sl_comm_request rq;
    EXPECT(sl_comm_iallreduce(world, ar2, 50, SL_DTYPE_F64, SL_OP_SUM, &rq) == 0);
    EXPECT(sl_comm_wait(&rq) == 0);
    for (size_t i = 0; i < 50; i++) {
        double want = 0;
        for (int r = 0; r < size; r++) want += (double)val(r, i);
        bad += ar[i] != want || ar2[i] != want;
    }
    EXPECT(bad == 0);
    report("chunked_allreduce");

    // reduce_scatter: separate and in place, blocking and non-blocking
    size_t rc = 23, n = rc * (size_t)size;
    float *in = malloc(n * sizeof(float)), *in2 = malloc(n * sizeof(float)), out[23], out2[23];
    for (size_t i = 0; i < n; i++) in[i] = in2[i] = (float)val(rank, i);
    EXPECT(sl_comm_reduce_scatter(world, in, out, rc, SL_DTYPE_F32, SL_OP_SUM) == 0);
    EXPECT(sl_comm_ireduce_scatter(world, in, out2, rc, SL_DTYPE_F32, SL_OP_SUM, &rq) == 0);
    EXPECT(sl_comm_wait(&rq) == 0);
    EXPECT(sl_comm_reduce_scatter(world, in2, in2 + (size_t)rank * rc, rc, SL_DTYPE_F32, SL_OP_SUM) == 0);
    bad = 0;
    for (size_t k = 0; k < rc; k++) {
        float want = 0;
        for (int r = 0; r < size; r++) want += (float)val(r, (size_t)rank * rc + k);
        bad += out[k] != want || out2[k] != want || in2[(size_t)rank * rc + k] != want;
    }
    for (size_t i = 0; i < n; i++)   // other blocks untouched
        if (i / rc != (size_t)rank) bad += in2[i] != (float)val(rank, i);
    EXPECT(bad == 0);
    report("chunked_reduce_scatter");

    // allgather: separate and in place, blocking and non-blocking
    size_t sc = 20;
    int32_t mine[20], *all = malloc(sc * (size_t)size * sizeof(int32_t)), *all2 = malloc(sc * (size_t)size * sizeof(int32_t));
    for (size_t k = 0; k < sc; k++) mine[k] = rank * 1000 + (int)k;
    EXPECT(sl_comm_allgather(world, mine, all, sc, SL_DTYPE_I32) == 0);
    memcpy(all2 + (size_t)rank * sc, mine, sizeof mine);
    EXPECT(sl_comm_iallgather(world, all2 + (size_t)rank * sc, all2, sc, SL_DTYPE_I32, &rq) == 0);
    EXPECT(sl_comm_wait(&rq) == 0);
    bad = 0;
    for (size_t i = 0; i < sc * (size_t)size; i++) {
        int32_t want = (int32_t)(i / sc) * 1000 + (int32_t)(i % sc);
        bad += all[i] != want || all2[i] != want;
    }
    EXPECT(bad == 0);
    report("chunked_allgather");

    // broadcast and send/recv
    int64_t bc[30], ring[25];
    for (int i = 0; i < 30; i++) bc[i] = rank == 0 ? i * 11 : -1;
    EXPECT(sl_comm_broadcast(world, bc, 30, SL_DTYPE_I64, 0) == 0);
    int64_t bc2[30];
    for (int i = 0; i < 30; i++) bc2[i] = rank == 1 ? i * 13 : -1;
    EXPECT(sl_comm_ibroadcast(world, bc2, 30, SL_DTYPE_I64, 1, &rq) == 0);
    EXPECT(sl_comm_wait(&rq) == 0);
    if (rank == 0) {
        for (int i = 0; i < 25; i++) ring[i] = 7 * i;
        EXPECT(sl_comm_send(world, ring, 25, SL_DTYPE_I64, 1, 3) == 0);
    } else if (rank == 1) {
        EXPECT(sl_comm_recv(world, ring, 25, SL_DTYPE_I64, 0, 3) == 0);
    }
    bad = 0;
    for (int i = 0; i < 30; i++) bad += bc[i] != i * 11 || bc2[i] != i * 13;
    if (rank <= 1)
        for (int i = 0; i < 25; i++) bad += ring[i] != 7 * i;
    EXPECT(bad == 0);
    report("chunked_broadcast_send_recv");
    sl_comm_mpi_set_max_chunk(old);
    free(in);
    free(in2);
    free(all);
    free(all2);
}

static void check_split_and_bytes(void) {
    sl_comm *half = NULL;
    EXPECT(sl_comm_split(world, rank % 2, -rank, "half", &half) == 0);   // reversed order by key
    int members = (size + 1 - rank % 2) / 2;
    EXPECT(half && sl_comm_size(half) == members);
    // key -rank: the highest world rank of the color is rank 0 of the group
    int highest = rank % 2 + 2 * (members - 1);
    EXPECT(half && sl_comm_rank(half) == (highest - rank) / 2);
    EXPECT(half && strcmp(sl_comm_name(half), "half") == 0 && sl_comm_bytes_sent(half) == 0);
    if (half) {
        int32_t x = rank;
        EXPECT(sl_comm_allreduce(half, &x, 1, SL_DTYPE_I32, SL_OP_SUM) == 0);
        int32_t want = 0;
        for (int r = rank % 2; r < size; r += 2) want += r;
        EXPECT(x == want);
        float blk[4 * 4] = {0}, one[4] = {0};
        EXPECT(sl_comm_reduce_scatter(half, blk, one, 4, SL_DTYPE_F32, SL_OP_SUM) == 0);
        EXPECT(sl_comm_allgather(half, one, blk, 4, SL_DTYPE_F32) == 0);
        EXPECT(sl_comm_broadcast(half, one, 2, SL_DTYPE_F32, 0) == 0);
        EXPECT(sl_comm_barrier(half) == 0);
        size_t want_bytes = 4 + (size_t)members * 16 + 16 + (sl_comm_rank(half) == 0 ? 8 : 0);
        EXPECT(sl_comm_bytes_sent(half) == want_bytes);
    }
    sl_comm_free(half);
    sl_comm *none = (sl_comm *)1;
    EXPECT(sl_comm_split(world, rank == 0 ? -1 : 0, rank, "not0", &none) == 0);
    EXPECT(rank == 0 ? none == NULL : (none && sl_comm_size(none) == size - 1 && sl_comm_rank(none) == rank - 1));
    if (rank != 0) sl_comm_free(none);
    report("split_order_and_bytes_sent");
}

// Checks that each group of t holds exactly the world ranks Megatron's formula gives.
static void check_topology(int tp, int pp) {
    sl_topology t;
    EXPECT(sl_topology_init(&t, world, tp, pp) == 0);
    if (!t.tp_group) {
        report("topology");
        return;
    }
    int dp = size / (tp * pp);
    EXPECT(t.tp == tp && t.pp == pp && t.dp == dp);
    EXPECT(rank == t.pp_rank * dp * tp + t.dp_rank * tp + t.tp_rank);
    EXPECT(sl_comm_size(t.tp_group) == tp && sl_comm_size(t.dp_group) == dp && sl_comm_size(t.pp_group) == pp);
    EXPECT(sl_comm_rank(t.tp_group) == t.tp_rank && sl_comm_rank(t.dp_group) == t.dp_rank &&
           sl_comm_rank(t.pp_group) == t.pp_rank);
    int32_t me = rank, got[8];
    sl_comm *groups[3] = {t.tp_group, t.dp_group, t.pp_group};
    for (int g = 0; g < 3; g++) {
        int n = sl_comm_size(groups[g]);
        EXPECT(sl_comm_allgather(groups[g], &me, got, 1, SL_DTYPE_I32) == 0);
        for (int i = 0; i < n; i++) {
            int tr = g == 0 ? i : t.tp_rank, dr = g == 1 ? i : t.dp_rank, pr = g == 2 ? i : t.pp_rank;
            EXPECT(got[i] == pr * dp * tp + dr * tp + tr);
        }
    }
    sl_topology_free(&t);
    EXPECT(t.tp_group == NULL && t.dp_group == NULL && t.pp_group == NULL);
    char name[64];
    snprintf(name, sizeof name, "topology_tp%d_pp%d_dp%d", tp, pp, dp);
    report(name);
}

static void check_topologies(void) {
    check_topology(1, 1);
    check_topology(size, 1);
    check_topology(1, size);
    if (size == 4) {   // Megatron's examples: tp 2 x dp 2, pp 2 x dp 2, tp 2 x pp 2
        check_topology(2, 1);
        check_topology(1, 2);
        check_topology(2, 2);
    }
    sl_topology t;
    EXPECT(sl_topology_init(&t, world, size + 1, 1) == -1);
    EXPECT(strstr(sl_error(), "does not divide the world size") != NULL);
    if (size == 3) {
        EXPECT(sl_topology_init(&t, world, 2, 1) == -1);
        EXPECT(strstr(sl_error(), "tensor-parallel size 2 x pipeline-parallel size 1 = 2") != NULL);
    }
    report("topology_rejects_bad_sizes");
}

int main(int argc, char **argv) {
    if (sl_comm_init_world(&world, "auto", &argc, &argv)) {
        fprintf(stderr, "init failed: %s\n", sl_error());
        printf("FAIL comm_mpi_init\n");
        return 1;
    }
    rank = sl_comm_rank(world);
    size = sl_comm_size(world);
    check_group = world;
    if (size < 2 || size > 8) {
        if (rank == 0) printf("FAIL np%d_world_size_between_2_and_8\n", size);
        sl_comm_free(world);
        return 1;
    }
    check_world();
    check_allreduce();
    check_reduce_scatter_allgather();
    check_broadcast_barrier();
    check_send_recv();
    check_nonblocking();
    check_chunked();
    check_split_and_bytes();
    check_topologies();
    sl_comm_free(world);   // MPI_Finalize: auto initialised MPI
    return total_failed ? 1 : 0;
}
