// test_comm_nccl.c: the "nccl" comm backend against the "mpi" one, on GPUs (tests/gpu/run.sh starts
// it under mpirun, one process per GPU; `make test-gpu`). Not part of `make test`: it needs CUDA and
// a GPU per process.
//
// Every process opens an NCCL world and an MPI world over the same ranks. Each check runs one
// operation on both with the same inputs: host buffers through MPI, device buffers (cudaMalloc)
// through NCCL, and compares the results byte for byte (the data are small integers, so every
// reduction order gives the same bits), and the bytes counted by both groups. Failures are combined
// over the ranks (MPI allreduce MAX) and rank 0 prints "PASS npN_nccl_name" / "FAIL npN_nccl_name".
//
// Covered: allreduce (sum/max/min x f32/f64/i32/i64), reduce_scatter and allgather (separate and in
// place), broadcast from the last rank (f64, u8), barrier, a send/recv ring, allgatherv (uneven,
// a zero count, gaps, in place) and reduce_scatterv (uneven, zero count, sum/max), every
// non-blocking form outstanding at once (test polling, reverse waits), a large allreduce, split
// groups, error messages naming the group, host buffers on the NCCL group (carried by its MPI
// communicator; mixing host and device buffers in one call is refused), and sl_comm_order_after
// (the collective waits for a copy still queued on another, non-blocking stream).
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"   // sl_dtype_size
#include "shardlm/comm.h"
#include "shardlm/error.h"
#include "../mpi/mpi_check.h"

static sl_comm *nccl, *mpi;

// ---- device helpers (a CUDA failure ends the test: nothing after it would mean anything) ----------

static void cuda_or_die(cudaError_t rc, const char *what) {
    if (rc == cudaSuccess) return;
    fprintf(stderr, "[rank %d] %s failed: %s\n", rank, what, cudaGetErrorString(rc));
    printf("FAIL np%d_nccl_cuda_%s\n", size, what);
    exit(1);
}

static void *dalloc(size_t bytes) {
    void *p = NULL;
    cuda_or_die(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    return p;
}

static void *upload(const void *h, size_t bytes) {
    void *d = dalloc(bytes);
    if (bytes) cuda_or_die(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    return d;
}

static void download(void *h, const void *d, size_t bytes) {
    if (bytes) cuda_or_die(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
}

// 1 when the device buffer holds the same bytes as the host buffer.
static int same(const void *d, const void *h, size_t bytes) {
    void *t = malloc(bytes ? bytes : 1);
    download(t, d, bytes);
    int eq = memcmp(t, h, bytes) == 0;
    free(t);
    return eq;
}

static size_t es_of(sl_dtype t) { return sl_dtype_size(t); }

// Small integers in the buffer's type, so sums are exact in every type.
static void fill(void *buf, sl_dtype t, size_t n, int r, size_t shift) {
    for (size_t i = 0; i < n; i++) {
        int64_t v = (int64_t)((r * 7 + (int)((i + shift) % 1000) * 3) % 11) - 5;
        switch (t) {
        case SL_DTYPE_F32: ((float *)buf)[i] = (float)v; break;
        case SL_DTYPE_F64: ((double *)buf)[i] = (double)v; break;
        case SL_DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
        case SL_DTYPE_I64: ((int64_t *)buf)[i] = v; break;
        case SL_DTYPE_U8: ((uint8_t *)buf)[i] = (uint8_t)(v + 100); break;
        }
    }
}

// The bytes both groups counted for the last operation agree.
static size_t mb0, nb0;
static void bytes_mark(void) {
    mb0 = sl_comm_bytes_sent(mpi);
    nb0 = sl_comm_bytes_sent(nccl);
}
static int bytes_agree(void) { return sl_comm_bytes_sent(mpi) - mb0 == sl_comm_bytes_sent(nccl) - nb0; }

// ---- checks ------------------------------------------------------------------------------------------

static void check_world(void) {
    EXPECT(sl_comm_backend_of(nccl) == SL_COMM_NCCL);
    EXPECT(sl_comm_rank(nccl) == sl_comm_rank(mpi) && sl_comm_size(nccl) == sl_comm_size(mpi));
    EXPECT(strcmp(sl_comm_name(nccl), "world") == 0);
    report("world_matches_mpi");
}

static void check_allreduce(void) {
    enum { N = 1001 };
    sl_dtype ts[4] = {SL_DTYPE_F32, SL_DTYPE_F64, SL_DTYPE_I32, SL_DTYPE_I64};
    const char *tn[4] = {"f32", "f64", "i32", "i64"};
    sl_reduce_op ops[3] = {SL_OP_SUM, SL_OP_MAX, SL_OP_MIN};
    const char *on[3] = {"sum", "max", "min"};
    for (int t = 0; t < 4; t++)
        for (int o = 0; o < 3; o++) {
            size_t bytes = N * es_of(ts[t]);
            void *h = malloc(bytes);
            fill(h, ts[t], N, rank, 0);
            void *d = upload(h, bytes);
            bytes_mark();
            EXPECT(sl_comm_allreduce(mpi, h, N, ts[t], ops[o]) == 0);
            EXPECT(sl_comm_allreduce(nccl, d, N, ts[t], ops[o]) == 0);
            EXPECT(same(d, h, bytes));
            EXPECT(bytes_agree());
            char name[64];
            snprintf(name, sizeof name, "allreduce_%s_%s", on[o], tn[t]);
            report(name);
            cudaFree(d);
            free(h);
        }
}

static void check_reduce_scatter_allgather(void) {
    size_t rc = 257, n = rc * (size_t)size;
    float *h = malloc(n * sizeof(float)), *hout = malloc(rc * sizeof(float));
    fill(h, SL_DTYPE_F32, n, rank, 1);
    float *d = upload(h, n * sizeof(float)), *dout = dalloc(rc * sizeof(float));
    bytes_mark();
    EXPECT(sl_comm_reduce_scatter(mpi, h, hout, rc, SL_DTYPE_F32, SL_OP_SUM) == 0);
    EXPECT(sl_comm_reduce_scatter(nccl, d, dout, rc, SL_DTYPE_F32, SL_OP_SUM) == 0);
    EXPECT(same(dout, hout, rc * sizeof(float)) && same(d, h, n * sizeof(float)));
    EXPECT(bytes_agree());
    report("reduce_scatter");

    // In place (only this rank's block changes), max.
    EXPECT(sl_comm_reduce_scatter(mpi, h, h + (size_t)rank * rc, rc, SL_DTYPE_F32, SL_OP_MAX) == 0);
    EXPECT(sl_comm_reduce_scatter(nccl, d, d + (size_t)rank * rc, rc, SL_DTYPE_F32, SL_OP_MAX) == 0);
    EXPECT(same(d, h, n * sizeof(float)));
    report("reduce_scatter_in_place");

    size_t sc = 129;
    double *gs = malloc(sc * sizeof(double)), *ga = malloc(sc * (size_t)size * sizeof(double));
    fill(gs, SL_DTYPE_F64, sc, rank, 2);
    double *dgs = upload(gs, sc * sizeof(double)), *dga = dalloc(sc * (size_t)size * sizeof(double));
    bytes_mark();
    EXPECT(sl_comm_allgather(mpi, gs, ga, sc, SL_DTYPE_F64) == 0);
    EXPECT(sl_comm_allgather(nccl, dgs, dga, sc, SL_DTYPE_F64) == 0);
    EXPECT(same(dga, ga, sc * (size_t)size * sizeof(double)));
    EXPECT(bytes_agree());
    report("allgather");

    // In place, u8: this rank's block already sits in the output.
    size_t uc = 33, un = uc * (size_t)size;
    uint8_t *u = calloc(un, 1);
    fill(u + (size_t)rank * uc, SL_DTYPE_U8, uc, rank, 3);
    uint8_t *du = upload(u, un);
    EXPECT(sl_comm_allgather(mpi, u + (size_t)rank * uc, u, uc, SL_DTYPE_U8) == 0);
    EXPECT(sl_comm_allgather(nccl, du + (size_t)rank * uc, du, uc, SL_DTYPE_U8) == 0);
    EXPECT(same(du, u, un));
    report("allgather_in_place_u8");
    cudaFree(d), cudaFree(dout), cudaFree(dgs), cudaFree(dga), cudaFree(du);
    free(h), free(hout), free(gs), free(ga), free(u);
}

static void check_broadcast_barrier(void) {
    int root = size - 1;
    double hd[17];
    uint8_t hu[33];
    fill(hd, SL_DTYPE_F64, 17, rank == root ? 99 : rank, 0);
    fill(hu, SL_DTYPE_U8, 33, rank == root ? 99 : rank, 5);
    double *dd = upload(hd, sizeof hd);
    uint8_t *du = upload(hu, sizeof hu);
    bytes_mark();
    EXPECT(sl_comm_broadcast(mpi, hd, 17, SL_DTYPE_F64, root) == 0);
    EXPECT(sl_comm_broadcast(mpi, hu, 33, SL_DTYPE_U8, root) == 0);
    EXPECT(sl_comm_broadcast(nccl, dd, 17, SL_DTYPE_F64, root) == 0);
    EXPECT(sl_comm_broadcast(nccl, du, 33, SL_DTYPE_U8, root) == 0);
    EXPECT(same(dd, hd, sizeof hd) && same(du, hu, sizeof hu));
    EXPECT(bytes_agree());
    report("broadcast_from_last_rank");
    EXPECT(sl_comm_barrier(nccl) == 0);
    EXPECT(sl_comm_barrier(nccl) == 0);
    report("barrier");
    cudaFree(dd), cudaFree(du);
}

static void check_send_recv(void) {
    if (size < 2) return;
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    int32_t out[9], in[9] = {0}, want[9];
    for (int i = 0; i < 9; i++) out[i] = rank * 100 + i, want[i] = prev * 100 + i;
    int32_t *dout = upload(out, sizeof out), *din = dalloc(sizeof in);
    bytes_mark();
    if (rank % 2 == 0) {
        EXPECT(sl_comm_send(nccl, dout, 9, SL_DTYPE_I32, next, 7) == 0);
        EXPECT(sl_comm_recv(nccl, din, 9, SL_DTYPE_I32, prev, 7) == 0);
    } else {
        EXPECT(sl_comm_recv(nccl, din, 9, SL_DTYPE_I32, prev, 7) == 0);
        EXPECT(sl_comm_send(nccl, dout, 9, SL_DTYPE_I32, next, 7) == 0);
    }
    EXPECT(same(din, want, sizeof want));
    EXPECT(sl_comm_bytes_sent(nccl) - nb0 == sizeof out);
    report("send_recv_ring");
    cudaFree(dout), cudaFree(din);
}

// Uneven counts (rank 1 none), blocks in reverse rank order with gaps of 2.
static size_t v_layout(size_t scale, size_t *counts, size_t *displs) {
    size_t off = 0;
    for (int r = size - 1; r >= 0; r--) {
        counts[r] = r == 1 ? 0 : (size_t)(2 * r + 3) * scale;
        off += 2;
        displs[r] = counts[r] ? off : 0;
        off += counts[r];
    }
    return off + 2;
}

static void check_v_forms(void) {
    size_t counts[8], displs[8];
    sl_dtype ts[2] = {SL_DTYPE_F32, SL_DTYPE_F64};
    const char *tn[2] = {"f32", "f64"};
    for (int t = 0; t < 2; t++) {
        size_t ext = v_layout(3, counts, displs), es = es_of(ts[t]);
        void *hs = malloc(counts[rank] * es + 1), *hr = calloc(ext, es);
        fill(hs, ts[t], counts[rank], rank, 4);
        void *ds = upload(hs, counts[rank] * es), *dr = upload(hr, ext * es);
        bytes_mark();
        EXPECT(sl_comm_allgatherv(mpi, counts[rank] ? hs : NULL, hr, counts, displs, ts[t]) == 0);
        EXPECT(sl_comm_allgatherv(nccl, counts[rank] ? ds : NULL, dr, counts, displs, ts[t]) == 0);
        EXPECT(same(dr, hr, ext * es));
        EXPECT(bytes_agree());
        char name[64];
        snprintf(name, sizeof name, "allgatherv_uneven_%s", tn[t]);
        report(name);

        // In place: this rank's block is already in the output.
        memset(hr, 0, ext * es);
        memcpy((char *)hr + displs[rank] * es, hs, counts[rank] * es);
        cudaFree(dr);
        dr = upload(hr, ext * es);
        char *hin = (char *)hr + displs[rank] * es, *din = (char *)dr + displs[rank] * es;
        EXPECT(sl_comm_allgatherv(mpi, hin, hr, counts, displs, ts[t]) == 0);
        EXPECT(sl_comm_allgatherv(nccl, din, dr, counts, displs, ts[t]) == 0);
        EXPECT(same(dr, hr, ext * es));
        snprintf(name, sizeof name, "allgatherv_in_place_%s", tn[t]);
        report(name);
        cudaFree(ds), cudaFree(dr);
        free(hs), free(hr);
    }
    sl_reduce_op ops[2] = {SL_OP_SUM, SL_OP_MAX};
    for (int t = 0; t < 2; t++) {
        size_t total = 0, es = es_of(ts[t]);
        v_layout(5, counts, displs);
        for (int r = 0; r < size; r++) total += counts[r];
        void *hs = malloc(total * es), *hr = calloc(counts[rank] + 1, es);
        fill(hs, ts[t], total, rank, 6);
        void *ds = upload(hs, total * es), *dr = dalloc(counts[rank] * es);
        bytes_mark();
        EXPECT(sl_comm_reduce_scatterv(mpi, hs, counts[rank] ? hr : NULL, counts, ts[t], ops[t]) == 0);
        EXPECT(sl_comm_reduce_scatterv(nccl, ds, counts[rank] ? dr : NULL, counts, ts[t], ops[t]) == 0);
        EXPECT(same(dr, hr, counts[rank] * es) && same(ds, hs, total * es));
        EXPECT(bytes_agree());
        char name[64];
        snprintf(name, sizeof name, "reduce_scatterv_%s_%s", t ? "max" : "sum", tn[t]);
        report(name);
        cudaFree(ds), cudaFree(dr);
        free(hs), free(hr);
    }
}

// Every non-blocking form outstanding at once on the NCCL group, polled and waited in reverse.
static void check_nonblocking(void) {
    enum { K = 3, N = 1 << 20, R = 8 };
    sl_comm_request req[K + 5];
    float *h[K], *d[K];
    for (int k = 0; k < K; k++) {
        h[k] = malloc(N * sizeof(float));
        fill(h[k], SL_DTYPE_F32, N, rank, (size_t)k);
        d[k] = upload(h[k], N * sizeof(float));
        EXPECT(sl_comm_iallreduce(nccl, d[k], N, SL_DTYPE_F32, SL_OP_SUM, &req[k]) == 0);
    }
    size_t rc = 1000, n = rc * (size_t)size;
    float *rs = malloc(n * sizeof(float)), *rso = malloc(rc * sizeof(float));
    fill(rs, SL_DTYPE_F32, n, rank, 9);
    float *drs = upload(rs, n * sizeof(float)), *drso = dalloc(rc * sizeof(float));
    EXPECT(sl_comm_ireduce_scatter(nccl, drs, drso, rc, SL_DTYPE_F32, SL_OP_SUM, &req[K]) == 0);
    int64_t ag[R], aga[R * 8];
    fill(ag, SL_DTYPE_I64, R, rank, 10);
    int64_t *dag = upload(ag, sizeof ag), *daga = dalloc(sizeof(int64_t) * R * (size_t)size);
    EXPECT(sl_comm_iallgather(nccl, dag, daga, R, SL_DTYPE_I64, &req[K + 1]) == 0);
    double bc[5];
    fill(bc, SL_DTYPE_F64, 5, rank == 0 ? 42 : rank, 0);
    double *dbc = upload(bc, sizeof bc);
    EXPECT(sl_comm_ibroadcast(nccl, dbc, 5, SL_DTYPE_F64, 0, &req[K + 2]) == 0);
    size_t *counts = malloc(8 * sizeof *counts), *displs = malloc(8 * sizeof *displs);
    size_t ext = v_layout(100, counts, displs), vc[8], vd[8];
    memcpy(vc, counts, sizeof vc);
    memcpy(vd, displs, sizeof vd);
    float *vs = malloc(vc[rank] * sizeof(float) + 1), *vr = calloc(ext, sizeof(float));
    fill(vs, SL_DTYPE_F32, vc[rank], rank, 11);
    float *dvs = upload(vs, vc[rank] * sizeof(float)), *dvr = upload(vr, ext * sizeof(float));
    EXPECT(sl_comm_iallgatherv(nccl, dvs, dvr, counts, displs, SL_DTYPE_F32, &req[K + 3]) == 0);
    size_t total = 0;
    for (int r = 0; r < size; r++) total += vc[r];
    double *ws = malloc(total * sizeof(double)), *wr = calloc(vc[rank] + 1, sizeof(double));
    fill(ws, SL_DTYPE_F64, total, rank, 12);
    double *dws = upload(ws, total * sizeof(double)), *dwr = dalloc(vc[rank] * sizeof(double));
    EXPECT(sl_comm_ireduce_scatterv(nccl, dws, dwr, counts, SL_DTYPE_F64, SL_OP_SUM, &req[K + 4]) == 0);
    free(counts);   // only read during the call
    free(displs);

    int done = 0;
    for (long spin = 0; spin < 100000000L && !done; spin++) EXPECT(sl_comm_test(&req[K + 2], &done) == 0);
    EXPECT(done && req[K + 2].done && req[K + 2].impl == NULL);
    for (int k = K + 4; k >= 0; k--) EXPECT(sl_comm_wait(&req[k]) == 0);
    for (int k = 0; k < K + 5; k++) EXPECT(req[k].done == 1 && req[k].impl == NULL);
    EXPECT(sl_comm_wait(&req[0]) == 0);

    // The same operations through MPI, blocking, for the expected results.
    for (int k = 0; k < K; k++) {
        EXPECT(sl_comm_allreduce(mpi, h[k], N, SL_DTYPE_F32, SL_OP_SUM) == 0);
        EXPECT(same(d[k], h[k], N * sizeof(float)));
    }
    EXPECT(sl_comm_reduce_scatter(mpi, rs, rso, rc, SL_DTYPE_F32, SL_OP_SUM) == 0);
    EXPECT(same(drso, rso, rc * sizeof(float)));
    EXPECT(sl_comm_allgather(mpi, ag, aga, R, SL_DTYPE_I64) == 0);
    EXPECT(same(daga, aga, sizeof(int64_t) * R * (size_t)size));
    EXPECT(sl_comm_broadcast(mpi, bc, 5, SL_DTYPE_F64, 0) == 0);
    EXPECT(same(dbc, bc, sizeof bc));
    EXPECT(sl_comm_allgatherv(mpi, vs, vr, vc, vd, SL_DTYPE_F32) == 0);
    EXPECT(same(dvr, vr, ext * sizeof(float)));
    EXPECT(sl_comm_reduce_scatterv(mpi, ws, vc[rank] ? wr : NULL, vc, SL_DTYPE_F64, SL_OP_SUM) == 0);
    EXPECT(same(dwr, wr, vc[rank] * sizeof(double)));
    report("nonblocking_all_forms_outstanding");
    for (int k = 0; k < K; k++) cudaFree(d[k]), free(h[k]);
    cudaFree(drs), cudaFree(drso), cudaFree(dag), cudaFree(daga), cudaFree(dbc), cudaFree(dvs), cudaFree(dvr);
    cudaFree(dws), cudaFree(dwr);
    free(rs), free(rso), free(vs), free(vr), free(ws), free(wr);
}

static void check_large(void) {
    size_t n = (size_t)64 << 20;   // 256 MiB of f32
    float *h = malloc(n * sizeof(float));
    fill(h, SL_DTYPE_F32, n, rank, 13);
    float *d = upload(h, n * sizeof(float));
    EXPECT(sl_comm_allreduce(nccl, d, n, SL_DTYPE_F32, SL_OP_SUM) == 0);
    EXPECT(sl_comm_allreduce(mpi, h, n, SL_DTYPE_F32, SL_OP_SUM) == 0);
    EXPECT(same(d, h, n * sizeof(float)));
    report("allreduce_256MiB");
    cudaFree(d);
    free(h);
}

static void check_split_and_errors(void) {
    sl_comm *hn = NULL, *hm = NULL;
    EXPECT(sl_comm_split(nccl, rank % 2, -rank, "half", &hn) == 0);
    EXPECT(sl_comm_split(mpi, rank % 2, -rank, "half", &hm) == 0);
    EXPECT(hn && hm && sl_comm_size(hn) == sl_comm_size(hm) && sl_comm_rank(hn) == sl_comm_rank(hm));
    EXPECT(hn && sl_comm_backend_of(hn) == SL_COMM_NCCL && strcmp(sl_comm_name(hn), "half") == 0);
    if (hn && hm) {
        int64_t x[3] = {rank, rank * 2, -rank};
        int64_t *dx = upload(x, sizeof x);
        EXPECT(sl_comm_allreduce(hm, x, 3, SL_DTYPE_I64, SL_OP_SUM) == 0);
        EXPECT(sl_comm_allreduce(hn, dx, 3, SL_DTYPE_I64, SL_OP_SUM) == 0);
        EXPECT(same(dx, x, sizeof x));
        EXPECT(sl_comm_barrier(hn) == 0);
        EXPECT(sl_comm_bytes_sent(hn) == sl_comm_bytes_sent(hm));
        cudaFree(dx);
    }
    sl_comm_free(hn);
    sl_comm_free(hm);
    sl_comm *none = (sl_comm *)1;
    EXPECT(sl_comm_split(nccl, rank == 0 ? -1 : 0, rank, "not0", &none) == 0);
    EXPECT(rank == 0 ? none == NULL : (none && sl_comm_size(none) == size - 1));
    if (rank != 0) sl_comm_free(none);
    report("split_matches_mpi");

    float *d = dalloc(4 * sizeof(float));
    EXPECT(sl_comm_broadcast(nccl, d, 4, SL_DTYPE_F32, size) == -1);
    EXPECT(strstr(sl_error(), "sl_comm_broadcast on group world") && strstr(sl_error(), "root"));
    report("errors_name_the_group");
    cudaFree(d);
}

// Host buffers handed to the NCCL group (the engine's losses, norms, flags, checkpoint status) go over
// its MPI communicator: the MPI world's results and byte counts, blocking and non-blocking.
static void check_host_buffers(void) {
    double h[7], m[7];
    fill(h, SL_DTYPE_F64, 7, rank, 14);
    memcpy(m, h, sizeof h);
    bytes_mark();
    EXPECT(sl_comm_allreduce(nccl, h, 7, SL_DTYPE_F64, SL_OP_SUM) == 0);
    EXPECT(sl_comm_allreduce(mpi, m, 7, SL_DTYPE_F64, SL_OP_SUM) == 0);
    EXPECT(memcmp(h, m, sizeof h) == 0);
    EXPECT(bytes_agree());
    int64_t mine[3] = {rank, 2 * rank, -rank}, all_n[3 * 8], all_m[3 * 8];
    EXPECT(sl_comm_allgather(nccl, mine, all_n, 3, SL_DTYPE_I64) == 0);
    EXPECT(sl_comm_allgather(mpi, mine, all_m, 3, SL_DTYPE_I64) == 0);
    EXPECT(memcmp(all_n, all_m, 3 * sizeof(int64_t) * (size_t)size) == 0);
    int32_t flag_n = rank == size - 1, flag_m = flag_n;
    sl_comm_request req;
    EXPECT(sl_comm_iallreduce(nccl, &flag_n, 1, SL_DTYPE_I32, SL_OP_MAX, &req) == 0);
    EXPECT(sl_comm_wait(&req) == 0 && req.done && req.impl == NULL);
    EXPECT(sl_comm_allreduce(mpi, &flag_m, 1, SL_DTYPE_I32, SL_OP_MAX) == 0);
    EXPECT(flag_n == flag_m && flag_n == 1);
    char path[64] = "", want[64] = "";
    if (rank == 0) snprintf(path, sizeof path, "/tmp/checkpoint-%d", size);
    snprintf(want, sizeof want, "/tmp/checkpoint-%d", size);
    EXPECT(sl_comm_broadcast(nccl, path, sizeof path, SL_DTYPE_U8, 0) == 0);
    EXPECT(strcmp(path, want) == 0);
    report("host_buffers_go_over_mpi");

    float *d = dalloc(4 * sizeof(float)), hf[4 * 8];
    EXPECT(sl_comm_allgather(nccl, d, hf, 4, SL_DTYPE_F32) == -1);
    EXPECT(strstr(sl_error(), "host memory") && strstr(sl_error(), "group world"));
    report("mixed_host_and_device_buffers_are_refused");
    cudaFree(d);
}

// sl_comm_order_after: the group's stream waits for a copy still queued on another, non-blocking
// stream (as the CUDA ops backend queues its kernels), so the collective reduces the copied data,
// not the zeros the buffer held before. 128 MiB from pinned memory takes long enough that an
// unordered all-reduce would overtake the copy.
static void check_order_after(void) {
    size_t n = (size_t)32 << 20;
    float *h = NULL, *want = malloc(n * sizeof(float));
    cuda_or_die(cudaMallocHost((void **)&h, n * sizeof(float)), "cudaMallocHost");
    fill(h, SL_DTYPE_F32, n, rank, 15);
    memcpy(want, h, n * sizeof(float));
    float *d = dalloc(n * sizeof(float));
    cuda_or_die(cudaMemset(d, 0, n * sizeof(float)), "cudaMemset");
    cuda_or_die(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    cudaStream_t s;
    cuda_or_die(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    cuda_or_die(cudaMemcpyAsync(d, h, n * sizeof(float), cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
    EXPECT(sl_comm_order_after(nccl, (void *)s) == 0);
    EXPECT(sl_comm_allreduce(nccl, d, n, SL_DTYPE_F32, SL_OP_SUM) == 0);
    EXPECT(sl_comm_allreduce(mpi, want, n, SL_DTYPE_F32, SL_OP_SUM) == 0);
    EXPECT(same(d, want, n * sizeof(float)));
    EXPECT(sl_comm_order_after(nccl, NULL) == 0);       // nothing to wait for
    EXPECT(sl_comm_order_after(mpi, (void *)s) == 0);   // host memory: nothing to order
    report("order_after_waits_for_another_stream");
    cuda_or_die(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    cudaStreamDestroy(s);
    cudaFreeHost(h);
    cudaFree(d);
    free(want);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);   // line-buffered: a crash keeps the lines printed so far
    if (!sl_comm_nccl_built()) {
        printf("SKIP test_comm_nccl: libshardlm was built without NCCL\n");
        return 0;
    }
    if (sl_comm_init_world(&nccl, "nccl", &argc, &argv)) {
        fprintf(stderr, "nccl init failed: %s\n", sl_error());
        printf("FAIL nccl_init\n");
        return 1;
    }
    if (sl_comm_init_world(&mpi, "mpi", &argc, &argv)) {
        fprintf(stderr, "mpi init failed: %s\n", sl_error());
        printf("FAIL nccl_mpi_init\n");
        return 1;
    }
    rank = sl_comm_rank(mpi);
    size = sl_comm_size(mpi);
    check_group = mpi;
    check_prefix = "nccl_";
    check_world();
    check_allreduce();
    check_reduce_scatter_allgather();
    check_broadcast_barrier();
    check_send_recv();
    check_v_forms();
    check_nonblocking();
    check_large();
    check_split_and_errors();
    check_host_buffers();
    check_order_after();
    sl_comm_free(nccl);
    sl_comm_free(mpi);   // the last group: MPI_Finalize
    if (rank == 0) printf("%s test_comm_nccl: %d failed\n", total_failed ? "FAILED" : "DONE", total_failed);
    return total_failed ? 1 : 0;
}
