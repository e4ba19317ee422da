// test_comm_v_mpi.c: the variable-count collectives (allgatherv, reduce_scatterv and their
// non-blocking forms) on the "mpi" backend under mpirun (tests/cli/test_comm_mpi.sh starts it with
// -np 2, 3 and 4, after test_comm_mpi.c). Same reporting as test_comm_mpi.c: every check runs on
// every rank, failures are combined with an allreduce (MAX), and rank 0 prints one
// "PASS npN_v_name" / "FAIL npN_v_name" line per check.
//
// Covered: uneven counts with a zero-count rank (NULL buffers there), blocks placed in reverse rank
// order with gaps that must stay untouched, in-place allgatherv, all-zero counts, reduce_scatterv
// (sum / max, f32 / f64 / i32), several non-blocking v-forms outstanding at once with their
// counts/displs freed or overwritten right after the start, argument errors (overlapping blocks,
// counts above INT_MAX) that leave the group usable, a sub-group, and byte counting.
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shardlm/comm.h"
#include "shardlm/error.h"
#include "mpi_check.h"

static sl_comm *world;

// Uneven counts: rank 1 contributes nothing; the others 2r+3 elements, times `scale`.
static size_t count_of(int r, size_t scale) { return r == 1 ? 0 : (size_t)(2 * r + 3) * scale; }

// Blocks in reverse rank order with a gap of 2 elements before each; returns the extent. The
// zero-count rank gets displacement 0, which overlaps other blocks (allowed: it is empty).
static size_t layout(int n, size_t scale, size_t *counts, size_t *displs) {
    size_t off = 0;
    for (int r = n - 1; r >= 0; r--) {
        counts[r] = count_of(r, scale);
        off += 2;
        displs[r] = counts[r] ? off : 0;
        off += counts[r];
    }
    return off + 2;
}

static double gval(int r, size_t i) { return (double)(r * 1000 + (int)i) + 0.5; }   // exact in f32

// ---- checks ------------------------------------------------------------------------------------------

static void check_allgatherv_dtype(sl_dtype dtype, const char *name) {
    size_t counts[8], displs[8];
    size_t extent = layout(size, 1, counts, displs);
    int f64 = dtype == SL_DTYPE_F64;
    size_t es = f64 ? 8 : 4;
    void *send = counts[rank] ? malloc(counts[rank] * es) : NULL;   // rank 1: NULL send
    void *recv = malloc(extent * es);
    for (size_t i = 0; i < counts[rank]; i++) {
        if (f64) ((double *)send)[i] = gval(rank, i);
        else ((float *)send)[i] = (float)gval(rank, i);
    }
    for (size_t i = 0; i < extent; i++) {
        if (f64) ((double *)recv)[i] = -7;
        else ((float *)recv)[i] = -7;
    }
    size_t before = sl_comm_bytes_sent(world);
    EXPECT(sl_comm_allgatherv(world, send, recv, counts, displs, dtype) == 0);
    EXPECT(sl_comm_bytes_sent(world) - before == counts[rank] * es);
    int bad = 0;
    for (size_t i = 0; i < extent; i++) {
        double want = -7;
        for (int r = 0; r < size; r++)
            if (counts[r] && i >= displs[r] && i < displs[r] + counts[r]) want = gval(r, i - displs[r]);
        double got = f64 ? ((double *)recv)[i] : (double)((float *)recv)[i];
        bad += got != want;
    }
    EXPECT(bad == 0);
    report(name);
    free(send);
    free(recv);
}

static void check_allgatherv_in_place(void) {
    size_t counts[8], displs[8];
    size_t extent = layout(size, 3, counts, displs);
    float *buf = malloc(extent * sizeof(float));
    for (size_t i = 0; i < extent; i++) buf[i] = -1;
    for (size_t i = 0; i < counts[rank]; i++) buf[displs[rank] + i] = (float)gval(rank, i);
    EXPECT(sl_comm_allgatherv(world, buf + displs[rank], buf, counts, displs, SL_DTYPE_F32) == 0);
    int bad = 0;
    for (size_t i = 0; i < extent; i++) {
        float want = -1;
        for (int r = 0; r < size; r++)
            if (counts[r] && i >= displs[r] && i < displs[r] + counts[r]) want = (float)gval(r, i - displs[r]);
        bad += buf[i] != want;
    }
    EXPECT(bad == 0);
    report("allgatherv_in_place");

    // The same in place on a double buffer, non-blocking.
    double *d = malloc(extent * sizeof(double));
    for (size_t i = 0; i < extent; i++) d[i] = i >= displs[rank] && i < displs[rank] + counts[rank] ? gval(rank, i - displs[rank]) : -1;
    sl_comm_request rq;
    EXPECT(sl_comm_iallgatherv(world, d + displs[rank], d, counts, displs, SL_DTYPE_F64, &rq) == 0);
    EXPECT(sl_comm_wait(&rq) == 0);
    bad = 0;
    for (size_t i = 0; i < extent; i++) {
        double want = -1;
        for (int r = 0; r < size; r++)
            if (counts[r] && i >= displs[r] && i < displs[r] + counts[r]) want = gval(r, i - displs[r]);
        bad += d[i] != want;
    }
    EXPECT(bad == 0);
    report("iallgatherv_in_place_f64");
    free(buf);
    free(d);
}

static void check_all_zero(void) {
    size_t counts[8] = {0}, displs[8] = {0};
    size_t before = sl_comm_bytes_sent(world);
    EXPECT(sl_comm_allgatherv(world, NULL, NULL, counts, displs, SL_DTYPE_F32) == 0);
    EXPECT(sl_comm_reduce_scatterv(world, NULL, NULL, counts, SL_DTYPE_F64, SL_OP_SUM) == 0);
    sl_comm_request r[2];
    EXPECT(sl_comm_iallgatherv(world, NULL, NULL, counts, displs, SL_DTYPE_F64, &r[0]) == 0);
    EXPECT(sl_comm_ireduce_scatterv(world, NULL, NULL, counts, SL_DTYPE_F32, SL_OP_MAX, &r[1]) == 0);
    EXPECT(r[0].done && r[1].done && sl_comm_wait(&r[0]) == 0 && sl_comm_wait(&r[1]) == 0);
    EXPECT(sl_comm_bytes_sent(world) == before);
    // Only the last rank has data.
    counts[size - 1] = 5;
    displs[size - 1] = 3;
    int32_t mine[5] = {1, 2, 3, 4, 5}, all[8] = {0};
    EXPECT(sl_comm_allgatherv(world, rank == size - 1 ? mine : NULL, all, counts, displs, SL_DTYPE_I32) == 0);
    EXPECT(all[0] == 0 && all[3] == 1 && all[7] == 5);
    report("all_zero_and_single_block");
}

// reduce_scatterv of dtype/op: block r holds counts[r] elements of val(rank, i + shift).
static void check_reduce_scatterv_case(sl_dtype dtype, sl_reduce_op op, const char *name) {
    size_t counts[8], total = 0;
    for (int r = 0; r < size; r++) total += counts[r] = count_of(r, 5);
    size_t es = dtype == SL_DTYPE_F64 ? 8 : 4, start = 0;
    for (int r = 0; r < rank; r++) start += counts[r];
    char *send = malloc(total * es);
    char *recv = counts[rank] ? malloc(counts[rank] * es) : NULL;   // rank 1: NULL recv
    for (size_t i = 0; i < total; i++) {
        int64_t v = val(rank, i + 11);
        if (dtype == SL_DTYPE_F32) ((float *)send)[i] = (float)v;
        if (dtype == SL_DTYPE_F64) ((double *)send)[i] = (double)v * 0.25;
        if (dtype == SL_DTYPE_I32) ((int32_t *)send)[i] = (int32_t)v;
    }
    size_t before = sl_comm_bytes_sent(world);
    EXPECT(sl_comm_reduce_scatterv(world, send, recv, counts, dtype, op) == 0);
    EXPECT(sl_comm_bytes_sent(world) - before == total * es);
    int bad = 0;
    for (size_t k = 0; k < counts[rank]; k++) {
        int64_t want = val(0, start + k + 11);
        for (int r = 1; r < size; r++) {
            int64_t v = val(r, start + k + 11);
            if (op == SL_OP_SUM) want += v;
            if (op == SL_OP_MAX && v > want) want = v;
            if (op == SL_OP_MIN && v < want) want = v;
        }
        double got = dtype == SL_DTYPE_F32   ? ((float *)recv)[k]
                     : dtype == SL_DTYPE_F64 ? ((double *)recv)[k] * 4
                                             : (double)((int32_t *)recv)[k];
        bad += got != (double)want;
    }
    for (size_t i = 0; i < total; i++) {   // the input is left alone
        int64_t v = val(rank, i + 11);
        double got = dtype == SL_DTYPE_F32   ? ((float *)send)[i]
                     : dtype == SL_DTYPE_F64 ? ((double *)send)[i] * 4
                                             : (double)((int32_t *)send)[i];
        bad += got != (double)v;
    }
    EXPECT(bad == 0);
    report(name);
    free(send);
    free(recv);
}

static double busy_work(int n) {
    double s = 0;
    for (int i = 1; i <= n; i++) s += 1.0 / i;
    return s;
}

// Several non-blocking v-forms (and a plain iallreduce) outstanding at once; counts/displs are
// freed or overwritten right after each start.
static void check_nonblocking(void) {
    enum { NREQ = 5 };
    sl_comm_request req[NREQ];
    size_t scale = 20000;   // large enough that MPI cannot finish everything eagerly

    // 0: iallgatherv f32, counts on the heap, freed at once
    size_t *c0 = malloc(8 * sizeof *c0), *d0 = malloc(8 * sizeof *d0);
    size_t ext0 = layout(size, scale, c0, d0);
    size_t cnt0[8], dsp0[8];
    memcpy(cnt0, c0, sizeof cnt0);
    memcpy(dsp0, d0, sizeof dsp0);
    float *s0 = malloc((cnt0[rank] + 1) * sizeof(float)), *r0 = malloc(ext0 * sizeof(float));
    for (size_t i = 0; i < cnt0[rank]; i++) s0[i] = (float)gval(rank, i % 5000);
    for (size_t i = 0; i < ext0; i++) r0[i] = -3;
    EXPECT(sl_comm_iallgatherv(world, s0, r0, c0, d0, SL_DTYPE_F32, &req[0]) == 0);
    free(c0);
    free(d0);

    // 1: ireduce_scatterv f64 sum, counts on the stack, overwritten at once
    size_t c1[8], tot1 = 0, start1 = 0;
    for (int r = 0; r < size; r++) tot1 += c1[r] = count_of(r, scale / 2);
    for (int r = 0; r < rank; r++) start1 += c1[r];
    size_t mine1 = c1[rank];
    double *s1 = malloc(tot1 * sizeof(double)), *r1 = malloc((mine1 + 1) * sizeof(double));
    for (size_t i = 0; i < tot1; i++) s1[i] = (double)val(rank, i);
    EXPECT(sl_comm_ireduce_scatterv(world, s1, r1, c1, SL_DTYPE_F64, SL_OP_SUM, &req[1]) == 0);
    for (int r = 0; r < size; r++) c1[r] = (size_t)-1;

    // 2: a fixed-count iallreduce in between
    float ar[1000];
    for (int i = 0; i < 1000; i++) ar[i] = (float)val(rank, (size_t)i);
    EXPECT(sl_comm_iallreduce(world, ar, 1000, SL_DTYPE_F32, SL_OP_SUM, &req[2]) == 0);

    // 3: iallgatherv f64 in place
    size_t c3[8], d3[8];
    size_t ext3 = layout(size, 7, c3, d3);
    double *b3 = malloc(ext3 * sizeof(double));
    for (size_t i = 0; i < ext3; i++) b3[i] = -2;
    for (size_t i = 0; i < c3[rank]; i++) b3[d3[rank] + i] = gval(rank, i);
    size_t cnt3[8], dsp3[8];
    memcpy(cnt3, c3, sizeof cnt3);
    memcpy(dsp3, d3, sizeof dsp3);
    EXPECT(sl_comm_iallgatherv(world, b3 + d3[rank], b3, c3, d3, SL_DTYPE_F64, &req[3]) == 0);
    memset(c3, 0xff, sizeof c3);
    memset(d3, 0xff, sizeof d3);

    // 4: ireduce_scatterv f32 max
    size_t c4[8], tot4 = 0, start4 = 0;
    for (int r = 0; r < size; r++) tot4 += c4[r] = count_of(size - 1 - r, 13);
    for (int r = 0; r < rank; r++) start4 += c4[r];
    size_t mine4 = c4[rank];
    float *s4 = malloc(tot4 * sizeof(float)), *r4 = malloc((mine4 + 1) * sizeof(float));
    for (size_t i = 0; i < tot4; i++) s4[i] = (float)val(rank, i + 3);
    EXPECT(sl_comm_ireduce_scatterv(world, s4, r4, c4, SL_DTYPE_F32, SL_OP_MAX, &req[4]) == 0);
    memset(c4, 0, sizeof c4);

    volatile double sink = busy_work(200000);   // computation overlapped with communication
    (void)sink;
    int done = 0;
    for (int spin = 0; spin < 10000000 && !done; spin++) EXPECT(sl_comm_test(&req[3], &done) == 0);
    EXPECT(done && req[3].done && req[3].impl == NULL);
    for (int k = NREQ - 1; k >= 0; k--) EXPECT(sl_comm_wait(&req[k]) == 0);   // reverse order
    for (int k = 0; k < NREQ; k++) EXPECT(req[k].done == 1 && req[k].impl == NULL);

    int bad = 0;
    for (size_t i = 0; i < ext0; i++) {
        float want = -3;
        for (int r = 0; r < size; r++)
            if (cnt0[r] && i >= dsp0[r] && i < dsp0[r] + cnt0[r]) want = (float)gval(r, (i - dsp0[r]) % 5000);
        bad += r0[i] != want;
    }
    EXPECT(bad == 0);
    bad = 0;
    for (size_t k = 0; k < mine1; k++) {
        double want = 0;
        for (int r = 0; r < size; r++) want += (double)val(r, start1 + k);
        bad += r1[k] != want;
    }
    for (int i = 0; i < 1000; i++) {
        float want = 0;
        for (int r = 0; r < size; r++) want += (float)val(r, (size_t)i);
        bad += ar[i] != want;
    }
    for (size_t i = 0; i < ext3; i++) {
        double want = -2;
        for (int r = 0; r < size; r++)
            if (cnt3[r] && i >= dsp3[r] && i < dsp3[r] + cnt3[r]) want = gval(r, i - dsp3[r]);
        bad += b3[i] != want;
    }
    for (size_t k = 0; k < mine4; k++) {
        float want = (float)val(0, start4 + k + 3);
        for (int r = 1; r < size; r++) want = (float)val(r, start4 + k + 3) > want ? (float)val(r, start4 + k + 3) : want;
        bad += r4[k] != want;
    }
    EXPECT(bad == 0);
    report("nonblocking_several_outstanding");
    free(s0);
    free(r0);
    free(s1);
    free(r1);
    free(b3);
    free(s4);
    free(r4);
}

// Argument errors are found before any communication, identically on every rank, so the group
// stays usable afterwards.
static void check_errors(void) {
    float a[16] = {0}, b[64] = {0};
    size_t counts[8], displs[8];
    for (int r = 0; r < size; r++) {
        counts[r] = 2;
        displs[r] = (size_t)r;   // each block overlaps the next
    }
    size_t before = sl_comm_bytes_sent(world);
    EXPECT(sl_comm_allgatherv(world, a, b, counts, displs, SL_DTYPE_F32) == -1);
    EXPECT(strstr(sl_error(), "sl_comm_allgatherv on group world") && strstr(sl_error(), "blocks of ranks 0 and 1 overlap"));
    sl_comm_request rq;
    EXPECT(sl_comm_iallgatherv(world, a, b, counts, displs, SL_DTYPE_F32, &rq) == -1);
    EXPECT(rq.done == 1 && rq.impl == NULL);
    counts[size - 1] = (size_t)INT_MAX + 5;
    EXPECT(sl_comm_reduce_scatterv(world, a, b, counts, SL_DTYPE_F32, SL_OP_SUM) == -1);
    char want[64];
    snprintf(want, sizeof want, "counts[%d] = %zu exceeds INT_MAX", size - 1, (size_t)INT_MAX + 5);
    EXPECT(strstr(sl_error(), want) != NULL);
    for (int r = 0; r < size; r++) counts[r] = (size_t)INT_MAX / 2 + 1;   // each fine, the sum is not
    EXPECT(sl_comm_reduce_scatterv(world, a, b, counts, SL_DTYPE_F32, SL_OP_SUM) == -1);
    EXPECT(strstr(sl_error(), "sum to more than INT_MAX") != NULL);
    EXPECT(sl_comm_bytes_sent(world) == before);
    // The group still works.
    for (int r = 0; r < size; r++) {
        counts[r] = 1;
        displs[r] = (size_t)(size - 1 - r);
    }
    a[0] = (float)rank;
    EXPECT(sl_comm_allgatherv(world, a, b, counts, displs, SL_DTYPE_F32) == 0);
    int bad = 0;
    for (int r = 0; r < size; r++) bad += b[size - 1 - r] != (float)r;
    EXPECT(bad == 0);
    report("errors_leave_group_usable");
}

// On a sub-group (even / odd world ranks), with byte counting per group.
static void check_subgroup(void) {
    sl_comm *half = NULL;
    EXPECT(sl_comm_split(world, rank % 2, rank, "half", &half) == 0);
    if (!half) {
        report("subgroup_and_bytes");
        return;
    }
    int n = sl_comm_size(half), me = sl_comm_rank(half);
    size_t counts[8], displs[8], off = 0;
    for (int r = 0; r < n; r++) {
        counts[r] = (size_t)(r + 1);
        displs[r] = off;
        off += counts[r];
    }
    int64_t mine[8], all[64];
    for (size_t i = 0; i < counts[me]; i++) mine[i] = rank * 100 + (int64_t)i;
    EXPECT(sl_comm_allgatherv(half, mine, all, counts, displs, SL_DTYPE_I64) == 0);
    int bad = 0;
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < counts[r]; i++) bad += all[displs[r] + i] != (int64_t)(rank % 2 + 2 * r) * 100 + (int64_t)i;
    float in[64], out[8];
    for (size_t i = 0; i < off; i++) in[i] = 1;
    EXPECT(sl_comm_reduce_scatterv(half, in, out, counts, SL_DTYPE_F32, SL_OP_SUM) == 0);
    for (size_t i = 0; i < counts[me]; i++) bad += out[i] != (float)n;
    EXPECT(bad == 0);
    EXPECT(sl_comm_bytes_sent(half) == counts[me] * 8 + off * 4);
    sl_comm_free(half);
    report("subgroup_and_bytes");
}

int main(int argc, char **argv) {
    if (sl_comm_init_world(&world, "mpi", &argc, &argv)) {
        fprintf(stderr, "init failed: %s\n", sl_error());
        printf("FAIL comm_v_mpi_init\n");
        return 1;
    }
    rank = sl_comm_rank(world);
    size = sl_comm_size(world);
    check_group = world;
    check_prefix = "v_";
    if (size < 2 || size > 8) {
        if (rank == 0) printf("FAIL np%d_v_world_size_between_2_and_8\n", size);
        sl_comm_free(world);
        return 1;
    }
    check_allgatherv_dtype(SL_DTYPE_F32, "allgatherv_uneven_zero_gaps_f32");
    check_allgatherv_dtype(SL_DTYPE_F64, "allgatherv_uneven_zero_gaps_f64");
    check_allgatherv_in_place();
    check_all_zero();
    check_reduce_scatterv_case(SL_DTYPE_F32, SL_OP_SUM, "reduce_scatterv_sum_f32");
    check_reduce_scatterv_case(SL_DTYPE_F64, SL_OP_SUM, "reduce_scatterv_sum_f64");
    check_reduce_scatterv_case(SL_DTYPE_F64, SL_OP_MIN, "reduce_scatterv_min_f64");
    check_reduce_scatterv_case(SL_DTYPE_I32, SL_OP_MAX, "reduce_scatterv_max_i32");
    check_nonblocking();
    check_errors();
    check_subgroup();
    sl_comm_free(world);
    return total_failed ? 1 : 0;
}
