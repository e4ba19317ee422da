// test_comm_self.c: the "self" backend (a world of one process): every collective, the in-place
// forms, the variable-count forms (allgatherv, reduce_scatterv), non-blocking requests, split,
// topology with world size 1, byte counting, backend selection ("auto" without a launcher),
// sl_comm_order_after (nothing to order on host memory), and the errors (bad arguments, send/recv
// to oneself, topology sizes that do not divide the world, v-form counts above INT_MAX). The MPI
// backend is tested by tests/cli/test_comm_mpi.sh under mpirun.
#include <stdint.h>

#include "shardlm/comm.h"
#include "shardlm/error.h"
#include "test.h"

static sl_comm *self_world(void) {
    sl_comm *w = NULL;
    int rc = sl_comm_init_world(&w, "self", NULL, NULL);
    CHECK_MSG(rc == 0 && w, "%s", sl_error());
    return w;
}

// Every launcher variable launch_env reads, so "auto" sees a plain process.
static void clear_launch_env(void) {
    const char *vars[] = {"SHARDLM_RANK", "SHARDLM_WORLD_SIZE", "RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                          "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                          "SLURM_STEP_NUM_TASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

TEST(world_is_one_process) {
    sl_comm *w = self_world();
    if (!w) return;
    CHECK(sl_comm_rank(w) == 0);
    CHECK(sl_comm_size(w) == 1);
    CHECK(sl_comm_backend_of(w) == SL_COMM_SELF);
    CHECK(strcmp(sl_comm_name(w), "world") == 0);
    CHECK(sl_comm_bytes_sent(w) == 0);
    sl_comm_free(w);
    sl_comm_free(NULL);
}

TEST(auto_without_launcher_is_self) {
    clear_launch_env();
    sl_comm *w = NULL;
    CHECK_MSG(sl_comm_init_world(&w, "auto", NULL, NULL) == 0, "%s", sl_error());
    CHECK(w && sl_comm_backend_of(w) == SL_COMM_SELF);
    sl_comm_free(w);
    w = NULL;
    CHECK(sl_comm_init_world(&w, NULL, NULL, NULL) == 0);   // NULL means auto
    CHECK(w && sl_comm_size(w) == 1);
    sl_comm_free(w);
    // A launcher that says one process also gives self.
    setenv("SHARDLM_RANK", "0", 1);
    setenv("SHARDLM_WORLD_SIZE", "1", 1);
    w = NULL;
    CHECK(sl_comm_init_world(&w, "auto", NULL, NULL) == 0);
    CHECK(w && sl_comm_backend_of(w) == SL_COMM_SELF);
    sl_comm_free(w);
    // A malformed launcher variable is an error naming it.
    setenv("SHARDLM_WORLD_SIZE", "two", 1);
    w = NULL;
    CHECK(sl_comm_init_world(&w, "auto", NULL, NULL) == -1);
    CHECK(w == NULL);
    CHECK_MSG(strstr(sl_error(), "SHARDLM_WORLD_SIZE") != NULL, "%s", sl_error());
    clear_launch_env();
}

TEST(unknown_backend_is_an_error) {
    sl_comm *w = NULL;
    CHECK(sl_comm_init_world(&w, "gloo", NULL, NULL) == -1);
    CHECK(strstr(sl_error(), "gloo") != NULL);
    CHECK(w == NULL);
    CHECK(sl_comm_init_world(NULL, "self", NULL, NULL) == -1);
}

// Without NCCL at build time: a clear error. With it: on a machine without a usable GPU (or without
// the libraries) an error naming the backend, before MPI starts; with a GPU, a world of one.
TEST(nccl_backend_is_built_or_says_so) {
    sl_comm *w = NULL;
    int rc = sl_comm_init_world(&w, "nccl", NULL, NULL);
    if (!sl_comm_nccl_built()) {
        CHECK(rc == -1 && w == NULL);
        CHECK_MSG(strstr(sl_error(), "built without NCCL") != NULL, "%s", sl_error());
    } else if (rc == -1) {
        CHECK(w == NULL);
        CHECK_MSG(strstr(sl_error(), "comm backend nccl") != NULL, "%s", sl_error());
    } else {
        CHECK(w && sl_comm_backend_of(w) == SL_COMM_NCCL && sl_comm_size(w) == 1);
        sl_comm_free(w);
    }
}

TEST(allreduce_leaves_data) {
    sl_comm *w = self_world();
    if (!w) return;
    float f[5] = {1, -2, 3.5f, 4, 5};
    double d[3] = {1e300, -1, 0.25};
    int32_t i[2] = {INT32_MIN, 7};
    int64_t l[2] = {INT64_MAX, -3};
    sl_reduce_op ops[3] = {SL_OP_SUM, SL_OP_MAX, SL_OP_MIN};
    for (int k = 0; k < 3; k++) {
        CHECK(sl_comm_allreduce(w, f, 5, SL_DTYPE_F32, ops[k]) == 0);
        CHECK(sl_comm_allreduce(w, d, 3, SL_DTYPE_F64, ops[k]) == 0);
        CHECK(sl_comm_allreduce(w, i, 2, SL_DTYPE_I32, ops[k]) == 0);
        CHECK(sl_comm_allreduce(w, l, 2, SL_DTYPE_I64, ops[k]) == 0);
    }
    CHECK(f[2] == 3.5f && d[0] == 1e300 && i[0] == INT32_MIN && l[0] == INT64_MAX);
    CHECK(sl_comm_bytes_sent(w) == 3 * (5 * 4 + 3 * 8 + 2 * 4 + 2 * 8));
    CHECK(sl_comm_allreduce(w, NULL, 0, SL_DTYPE_F32, SL_OP_SUM) == 0);   // empty is fine
    sl_comm_free(w);
}

TEST(reduce_scatter_and_allgather_copy_the_block) {
    sl_comm *w = self_world();
    if (!w) return;
    float send[4] = {1, 2, 3, 4}, recv[4] = {0};
    CHECK(sl_comm_reduce_scatter(w, send, recv, 4, SL_DTYPE_F32, SL_OP_SUM) == 0);
    CHECK(memcmp(send, recv, sizeof send) == 0);
    int64_t a[3] = {5, 6, 7}, b[3] = {0};
    CHECK(sl_comm_allgather(w, a, b, 3, SL_DTYPE_I64) == 0);
    CHECK(b[0] == 5 && b[1] == 6 && b[2] == 7);
    // In-place forms: recv == send + rank * count (rank 0: the same pointer).
    CHECK(sl_comm_reduce_scatter(w, send, send, 4, SL_DTYPE_F32, SL_OP_MAX) == 0);
    CHECK(sl_comm_allgather(w, b, b, 3, SL_DTYPE_I64) == 0);
    CHECK(send[3] == 4 && b[2] == 7);
    uint8_t u[3] = {1, 2, 3}, v[3] = {0};
    CHECK(sl_comm_allgather(w, u, v, 3, SL_DTYPE_U8) == 0);
    CHECK(v[2] == 3);
    CHECK(sl_comm_bytes_sent(w) == 16 + 24 + 16 + 24 + 3);
    sl_comm_free(w);
}

TEST(overlapping_buffers_not_in_place_are_rejected) {
    sl_comm *w = self_world();
    if (!w) return;
    float buf[8] = {0};
    CHECK(sl_comm_reduce_scatter(w, buf, buf + 1, 4, SL_DTYPE_F32, SL_OP_SUM) == -1);
    CHECK_MSG(strstr(sl_error(), "overlap") != NULL, "%s", sl_error());
    CHECK(sl_comm_allgather(w, buf + 2, buf, 4, SL_DTYPE_F32) == -1);
    CHECK(strstr(sl_error(), "in-place") != NULL);
    sl_comm_free(w);
}

TEST(broadcast_barrier) {
    sl_comm *w = self_world();
    if (!w) return;
    double x[2] = {3, 4};
    CHECK(sl_comm_broadcast(w, x, 2, SL_DTYPE_F64, 0) == 0);
    CHECK(x[0] == 3 && x[1] == 4);
    CHECK(sl_comm_barrier(w) == 0);
    CHECK(sl_comm_bytes_sent(w) == 16);   // the root counts what it broadcasts
    CHECK(sl_comm_broadcast(w, x, 2, SL_DTYPE_F64, 1) == -1);
    CHECK_MSG(strstr(sl_error(), "root 1 out of range") && strstr(sl_error(), "group world (rank 0 of 1)"), "%s",
              sl_error());
    sl_comm_free(w);
}

TEST(send_recv_to_self_is_an_error) {
    sl_comm *w = self_world();
    if (!w) return;
    int x = 1;
    CHECK(sl_comm_send(w, &x, 1, SL_DTYPE_I32, 0, 0) == -1);
    CHECK_MSG(strstr(sl_error(), "sl_comm_send") && strstr(sl_error(), "this rank"), "%s", sl_error());
    CHECK(sl_comm_recv(w, &x, 1, SL_DTYPE_I32, 0, 0) == -1);
    CHECK(strstr(sl_error(), "sl_comm_recv") != NULL);
    CHECK(sl_comm_send(w, &x, 1, SL_DTYPE_I32, 1, 0) == -1);
    CHECK(strstr(sl_error(), "peer 1 out of range") != NULL);
    CHECK(sl_comm_bytes_sent(w) == 0);
    sl_comm_free(w);
}

TEST(bad_arguments_are_named) {
    sl_comm *w = self_world();
    if (!w) return;
    float f[2] = {0};
    CHECK(sl_comm_allreduce(NULL, f, 2, SL_DTYPE_F32, SL_OP_SUM) == -1);
    CHECK(strstr(sl_error(), "group is NULL") != NULL);
    CHECK(sl_comm_allreduce(w, NULL, 2, SL_DTYPE_F32, SL_OP_SUM) == -1);
    CHECK(strstr(sl_error(), "NULL") != NULL);
    CHECK(sl_comm_allreduce(w, f, 2, (sl_dtype)42, SL_OP_SUM) == -1);
    CHECK(strstr(sl_error(), "dtype 42") != NULL);
    CHECK(sl_comm_allreduce(w, f, 2, SL_DTYPE_F32, (sl_reduce_op)9) == -1);
    CHECK(strstr(sl_error(), "reduce op 9") != NULL);
    CHECK(sl_comm_allreduce(w, f, SIZE_MAX / 2, SL_DTYPE_F32, SL_OP_SUM) == -1);
    CHECK(strstr(sl_error(), "overflow") != NULL);
    CHECK(sl_comm_allgather(w, f, NULL, 1, SL_DTYPE_F32) == -1);
    CHECK(sl_comm_split(w, 0, 0, "a-name-that-is-far-too-long-for-a-group", NULL) == -1);
    sl_comm_request r;
    CHECK(sl_comm_iallreduce(w, f, 2, SL_DTYPE_F32, SL_OP_SUM, NULL) == -1);
    CHECK(strstr(sl_error(), "request is NULL") != NULL);
    CHECK(sl_comm_ibroadcast(w, f, 2, SL_DTYPE_F32, 3, &r) == -1);
    CHECK(r.done == 1 && r.impl == NULL);   // a failed start leaves a completed request
    CHECK(sl_comm_wait(&r) == 0);
    CHECK(sl_comm_wait(NULL) == -1);
    CHECK(sl_comm_test(NULL, NULL) == -1);
    CHECK(sl_comm_bytes_sent(w) == 0);
    sl_comm_free(w);
}

TEST(nonblocking_complete_immediately) {
    sl_comm *w = self_world();
    if (!w) return;
    float a[4] = {1, 2, 3, 4}, b[4] = {0}, c[4] = {0}, d[4] = {9, 9, 9, 9};
    sl_comm_request r[4];
    memset(r, 0xff, sizeof r);
    CHECK(sl_comm_iallreduce(w, a, 4, SL_DTYPE_F32, SL_OP_SUM, &r[0]) == 0);
    CHECK(sl_comm_ireduce_scatter(w, a, b, 4, SL_DTYPE_F32, SL_OP_SUM, &r[1]) == 0);
    CHECK(sl_comm_iallgather(w, a, c, 4, SL_DTYPE_F32, &r[2]) == 0);
    CHECK(sl_comm_ibroadcast(w, d, 4, SL_DTYPE_F32, 0, &r[3]) == 0);
    for (int i = 0; i < 4; i++) {
        CHECK(r[i].done == 1 && r[i].impl == NULL);
        int done = 0;
        CHECK(sl_comm_test(&r[i], &done) == 0);
        CHECK(done == 1);
    }
    for (int i = 3; i >= 0; i--) CHECK(sl_comm_wait(&r[i]) == 0);
    CHECK(memcmp(a, b, sizeof a) == 0 && memcmp(a, c, sizeof a) == 0 && d[0] == 9);
    CHECK(sl_comm_bytes_sent(w) == 4 * 16);
    sl_comm_free(w);
}

TEST(allgatherv_places_the_block_at_its_displacement) {
    sl_comm *w = self_world();
    if (!w) return;
    float send[3] = {1, 2, 3}, recv[6] = {9, 9, 9, 9, 9, 9};
    size_t counts[1] = {3}, displs[1] = {2};
    CHECK_MSG(sl_comm_allgatherv(w, send, recv, counts, displs, SL_DTYPE_F32) == 0, "%s", sl_error());
    CHECK(recv[0] == 9 && recv[1] == 9 && recv[2] == 1 && recv[3] == 2 && recv[4] == 3 && recv[5] == 9);
    CHECK(sl_comm_bytes_sent(w) == 12);
    // In place: send == recv + displs[rank]; the block stays as it is.
    double d[4] = {5, 6, 7, 8};
    size_t c2[1] = {2}, d2[1] = {1};
    CHECK_MSG(sl_comm_allgatherv(w, d + 1, d, c2, d2, SL_DTYPE_F64) == 0, "%s", sl_error());
    CHECK(d[0] == 5 && d[1] == 6 && d[2] == 7 && d[3] == 8);
    CHECK(sl_comm_bytes_sent(w) == 12 + 16);
    // Zero counts: nothing happens, buffers may be NULL, nothing is counted.
    size_t zero[1] = {0}, far[1] = {1000};
    CHECK_MSG(sl_comm_allgatherv(w, NULL, NULL, zero, far, SL_DTYPE_F32) == 0, "%s", sl_error());
    CHECK(sl_comm_bytes_sent(w) == 28);
    sl_comm_free(w);
}

TEST(reduce_scatterv_copies_the_block) {
    sl_comm *w = self_world();
    if (!w) return;
    int64_t send[3] = {4, -5, 6}, recv[3] = {0};
    size_t counts[1] = {3};
    CHECK_MSG(sl_comm_reduce_scatterv(w, send, recv, counts, SL_DTYPE_I64, SL_OP_SUM) == 0, "%s", sl_error());
    CHECK(recv[0] == 4 && recv[1] == -5 && recv[2] == 6);
    CHECK(sl_comm_bytes_sent(w) == 24);
    float f[2] = {1.5f, 2.5f}, g[2] = {0};
    CHECK(sl_comm_reduce_scatterv(w, f, g, (size_t[]){2}, SL_DTYPE_F32, SL_OP_MIN) == 0);
    CHECK(g[0] == 1.5f && g[1] == 2.5f);
    CHECK(sl_comm_reduce_scatterv(w, NULL, NULL, (size_t[]){0}, SL_DTYPE_F64, SL_OP_MAX) == 0);   // empty
    CHECK(sl_comm_bytes_sent(w) == 24 + 8);
    sl_comm_free(w);
}

TEST(nonblocking_v_forms_copy_counts) {
    sl_comm *w = self_world();
    if (!w) return;
    // counts/displs are only read during the call: free them before waiting.
    size_t *counts = malloc(sizeof *counts), *displs = malloc(sizeof *displs);
    counts[0] = 4;
    displs[0] = 1;
    double src[4] = {1, 2, 3, 4}, dst[5] = {0}, red[4] = {0};
    sl_comm_request r[3];
    memset(r, 0xff, sizeof r);
    CHECK_MSG(sl_comm_iallgatherv(w, src, dst, counts, displs, SL_DTYPE_F64, &r[0]) == 0, "%s", sl_error());
    CHECK(sl_comm_ireduce_scatterv(w, src, red, counts, SL_DTYPE_F64, SL_OP_SUM, &r[1]) == 0);
    counts[0] = 0;
    CHECK(sl_comm_iallgatherv(w, NULL, NULL, counts, displs, SL_DTYPE_F64, &r[2]) == 0);   // zero count
    free(counts);
    free(displs);
    for (int i = 0; i < 3; i++) {
        CHECK(r[i].done == 1 && r[i].impl == NULL);
        int done = 0;
        CHECK(sl_comm_test(&r[i], &done) == 0 && done == 1);
        CHECK(sl_comm_wait(&r[i]) == 0);
    }
    CHECK(dst[0] == 0 && dst[1] == 1 && dst[4] == 4 && red[3] == 4);
    CHECK(sl_comm_bytes_sent(w) == 32 + 32);
    sl_comm_free(w);
}

TEST(v_form_bad_arguments_are_named) {
    sl_comm *w = self_world();
    if (!w) return;
    float buf[8] = {0}, out[8] = {0};
    size_t c1[1] = {2}, d0[1] = {0};
    const char *want_group = "group world (rank 0 of 1)";
    CHECK(sl_comm_allgatherv(NULL, buf, out, c1, d0, SL_DTYPE_F32) == -1);
    CHECK(strstr(sl_error(), "sl_comm_allgatherv: group is NULL") != NULL);
    CHECK(sl_comm_allgatherv(w, buf, out, NULL, d0, SL_DTYPE_F32) == -1);
    CHECK_MSG(strstr(sl_error(), "sl_comm_allgatherv") && strstr(sl_error(), want_group) &&
                  strstr(sl_error(), "counts is NULL"),
              "%s", sl_error());
    CHECK(sl_comm_allgatherv(w, buf, out, c1, NULL, SL_DTYPE_F32) == -1);
    CHECK(strstr(sl_error(), "displs is NULL") != NULL);
    CHECK(sl_comm_allgatherv(w, buf, out, c1, d0, (sl_dtype)17) == -1);
    CHECK(strstr(sl_error(), "dtype 17") != NULL);
    CHECK(sl_comm_allgatherv(w, NULL, out, c1, d0, SL_DTYPE_F32) == -1);
    CHECK(strstr(sl_error(), "send buffer is NULL") != NULL);
    CHECK(sl_comm_allgatherv(w, buf, NULL, c1, d0, SL_DTYPE_F32) == -1);
    CHECK(strstr(sl_error(), "recv buffer is NULL") != NULL);
    // Above INT_MAX: an error naming the entry (no chunking in the v-forms).
    size_t big[1] = {(size_t)INT32_MAX + 1};
    CHECK(sl_comm_allgatherv(w, buf, out, big, d0, SL_DTYPE_F32) == -1);
    CHECK_MSG(strstr(sl_error(), "counts[0] = 2147483648 exceeds INT_MAX") && strstr(sl_error(), want_group), "%s",
              sl_error());
    CHECK(sl_comm_allgatherv(w, buf, out, c1, big, SL_DTYPE_F32) == -1);
    CHECK_MSG(strstr(sl_error(), "displs[0] = 2147483648 exceeds INT_MAX"), "%s", sl_error());
    size_t dmax[1] = {(size_t)INT32_MAX};   // allowed as a displacement, but not with a NULL recv
    CHECK(sl_comm_allgatherv(w, buf, NULL, c1, dmax, SL_DTYPE_F32) == -1);
    // Overlap that is not the in-place form.
    size_t d1[1] = {1};
    CHECK(sl_comm_allgatherv(w, buf, buf, c1, d1, SL_DTYPE_F32) == -1);
    CHECK_MSG(strstr(sl_error(), "overlap") && strstr(sl_error(), "send == recv + displs[rank]"), "%s", sl_error());
    CHECK(sl_comm_allgatherv(w, buf + 1, buf, c1, d1, SL_DTYPE_F32) == 0);   // in place is fine

    CHECK(sl_comm_reduce_scatterv(w, buf, out, NULL, SL_DTYPE_F32, SL_OP_SUM) == -1);
    CHECK_MSG(strstr(sl_error(), "sl_comm_reduce_scatterv") && strstr(sl_error(), "counts is NULL"), "%s", sl_error());
    CHECK(sl_comm_reduce_scatterv(w, buf, out, c1, SL_DTYPE_F32, (sl_reduce_op)5) == -1);
    CHECK(strstr(sl_error(), "reduce op 5") != NULL);
    CHECK(sl_comm_reduce_scatterv(w, buf, out, big, SL_DTYPE_F32, SL_OP_SUM) == -1);
    CHECK_MSG(strstr(sl_error(), "counts[0] = 2147483648 exceeds INT_MAX"), "%s", sl_error());
    CHECK(sl_comm_reduce_scatterv(w, buf, buf + 1, c1, SL_DTYPE_F32, SL_OP_SUM) == -1);
    CHECK_MSG(strstr(sl_error(), "recv overlaps send"), "%s", sl_error());
    CHECK(sl_comm_reduce_scatterv(w, buf, buf, c1, SL_DTYPE_F32, SL_OP_SUM) == -1);   // no in-place form
    CHECK(sl_comm_reduce_scatterv(w, NULL, out, c1, SL_DTYPE_F32, SL_OP_SUM) == -1);
    CHECK(sl_comm_reduce_scatterv(w, buf, NULL, c1, SL_DTYPE_F32, SL_OP_SUM) == -1);
    CHECK(sl_comm_reduce_scatterv(w, buf, buf + 2, c1, SL_DTYPE_F32, SL_OP_SUM) == 0);   // adjacent is disjoint

    // Non-blocking: a NULL request, and a failed start leaves a completed request.
    sl_comm_request r;
    memset(&r, 0xff, sizeof r);
    CHECK(sl_comm_iallgatherv(w, buf, out, c1, d0, SL_DTYPE_F32, NULL) == -1);
    CHECK(strstr(sl_error(), "sl_comm_iallgatherv") && strstr(sl_error(), "request is NULL"));
    CHECK(sl_comm_ireduce_scatterv(w, buf, out, c1, SL_DTYPE_F32, SL_OP_SUM, NULL) == -1);
    CHECK(strstr(sl_error(), "request is NULL") != NULL);
    CHECK(sl_comm_iallgatherv(w, buf, out, big, d0, SL_DTYPE_F32, &r) == -1);
    CHECK_MSG(strstr(sl_error(), "sl_comm_iallgatherv") && strstr(sl_error(), "counts[0]"), "%s", sl_error());
    CHECK(r.done == 1 && r.impl == NULL && sl_comm_wait(&r) == 0);
    memset(&r, 0xff, sizeof r);
    CHECK(sl_comm_ireduce_scatterv(w, buf, buf, c1, SL_DTYPE_F32, SL_OP_SUM, &r) == -1);
    CHECK(strstr(sl_error(), "sl_comm_ireduce_scatterv") != NULL);
    CHECK(r.done == 1 && r.impl == NULL && sl_comm_wait(&r) == 0);
    // Only the two successful calls were counted.
    CHECK(sl_comm_bytes_sent(w) == 8 + 8);
    sl_comm_free(w);
}

TEST(split_gives_named_groups) {
    sl_comm *w = self_world();
    if (!w) return;
    sl_comm *g = NULL;
    CHECK(sl_comm_split(w, 3, 0, "dp", &g) == 0);
    CHECK(g && sl_comm_size(g) == 1 && sl_comm_rank(g) == 0 && strcmp(sl_comm_name(g), "dp") == 0);
    CHECK(g && sl_comm_backend_of(g) == SL_COMM_SELF);
    float x = 2;
    CHECK(sl_comm_allreduce(g, &x, 1, SL_DTYPE_F32, SL_OP_SUM) == 0);
    CHECK(sl_comm_bytes_sent(g) == 4 && sl_comm_bytes_sent(w) == 0);   // counted per group
    sl_comm *none = (sl_comm *)1;
    CHECK(sl_comm_split(w, -1, 0, "none", &none) == 0);   // negative color: not a member
    CHECK(none == NULL);
    sl_comm_free(g);
    sl_comm_free(w);
}

// Host-memory backends have nothing to order after: a stream (here a dummy handle, never touched)
// or none is accepted and changes nothing; a NULL group is an error.
TEST(order_after_is_a_no_op_on_the_self_backend) {
    sl_comm *w = self_world();
    if (!w) return;
    int dummy_stream;
    CHECK(sl_comm_order_after(w, NULL) == 0);
    CHECK(sl_comm_order_after(w, &dummy_stream) == 0);
    CHECK(sl_comm_bytes_sent(w) == 0);
    float f[2] = {1, 2};
    CHECK(sl_comm_allreduce(w, f, 2, SL_DTYPE_F32, SL_OP_SUM) == 0 && f[1] == 2);
    CHECK(sl_comm_order_after(NULL, &dummy_stream) == -1);
    CHECK_MSG(strstr(sl_error(), "sl_comm_order_after") != NULL, "%s", sl_error());
    sl_comm_free(w);
}

TEST(topology_world_of_one) {
    sl_comm *w = self_world();
    if (!w) return;
    sl_topology t;
    CHECK_MSG(sl_topology_init(&t, w, 1, 1) == 0, "%s", sl_error());
    CHECK(t.tp == 1 && t.pp == 1 && t.dp == 1);
    CHECK(t.tp_rank == 0 && t.pp_rank == 0 && t.dp_rank == 0);
    CHECK(t.world == w && t.tp_group && t.dp_group && t.pp_group);
    CHECK(t.dp_group && strcmp(sl_comm_name(t.dp_group), "dp") == 0 && sl_comm_size(t.dp_group) == 1);
    CHECK(t.tp_group && strcmp(sl_comm_name(t.tp_group), "tp") == 0);
    CHECK(t.pp_group && strcmp(sl_comm_name(t.pp_group), "pp") == 0);
    sl_topology_free(&t);
    CHECK(t.tp_group == NULL);

    CHECK(sl_topology_init(&t, w, 2, 1) == -1);
    CHECK_MSG(strstr(sl_error(), "tensor-parallel size 2") && strstr(sl_error(), "world size 1"), "%s", sl_error());
    CHECK(t.tp_group == NULL && t.dp_group == NULL);
    CHECK(sl_topology_init(&t, w, 1, 0) == -1);
    CHECK(strstr(sl_error(), "pipeline-parallel size 0") != NULL);
    CHECK(sl_topology_init(&t, NULL, 1, 1) == -1);
    sl_topology_free(&t);
    sl_comm_free(w);
}

TEST_MAIN()
