// comm_mpi.c: the "mpi" backend (Open MPI or any MPI-3 library), host memory only. Owns MPI's
// lifetime (MPI_Init_thread with MPI_THREAD_FUNNELED unless the caller already initialised it;
// MPI_Finalize once the world and every group split from it are freed, iff we initialised), one
// MPI communicator per group, and the translation of element counts above INT_MAX into several MPI
// calls.
//
// Invariants:
// - Every group's communicator is our own (MPI_Comm_dup of MPI_COMM_WORLD, or MPI_Comm_split of a
//   group) with MPI_ERRORS_RETURN, so a failure comes back as a code; every MPI call is checked by
//   mpi_check, which writes "MPI_Allreduce on group dp (rank 1 of 2) failed: <MPI_Error_string>".
// - No MPI call gets a count above max_chunk (INT_MAX unless a test lowers it): a large allreduce,
//   broadcast, send or recv is a sequence of calls on consecutive slices; a large allgather uses a
//   resized contiguous datatype per slice so each rank's block keeps its place; a large
//   reduce_scatter becomes one MPI_Reduce per (root, slice). The variable-count forms are one
//   MPI_(I)allgatherv / MPI_(I)reduce_scatter each (comm.c limits their counts to INT_MAX); a
//   non-blocking one owns int copies of counts/displs until it completes.
// - In-place reduce_scatter (recv == send + rank * recv_count) reduces into a temporary block and
//   copies it to recv on completion, so only this rank's block of the buffer changes.
// - Several non-blocking operations may be outstanding on a group; as MPI requires, every rank
//   must start them in the same order. A request owns its MPI requests and any temporary block.
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "shardlm/error.h"

typedef struct {
    MPI_Comm comm;
} mpi_group;

static size_t max_chunk = INT_MAX;
static int we_initialised;   // this library called MPI_Init_thread and owes MPI_Finalize
static int live_groups;      // MPI groups created and not yet freed
static int world_freed;      // a world group was freed; finalise when live_groups reaches 0

size_t sl_comm_mpi_set_max_chunk(size_t elements) {
    size_t old = max_chunk;
    max_chunk = (elements == 0 || elements > INT_MAX) ? (size_t)INT_MAX : elements;
    return old;
}

static MPI_Comm comm_of(const sl_comm *c) { return ((const mpi_group *)c->impl)->comm; }

static int error_string(int code, char *out, int cap) {
    int len = 0;
    if (cap < MPI_MAX_ERROR_STRING || MPI_Error_string(code, out, &len) != MPI_SUCCESS) {
        snprintf(out, (size_t)cap, "MPI error code %d", code);
    }
    return 0;
}

// 0 when rc is MPI_SUCCESS, else -1 with a message naming the call, the group and the rank.
static int mpi_check(const sl_comm *c, const char *call, int rc) {
    if (rc == MPI_SUCCESS) return 0;
    char s[MPI_MAX_ERROR_STRING];
    error_string(rc, s, sizeof s);
    return sl_errorf("%s on group %s (rank %d of %d) failed: %s", call, c->name, c->rank, c->size, s);
}

static MPI_Datatype mpi_type(sl_dtype dtype) {
    switch (dtype) {
    case SL_DTYPE_F32: return MPI_FLOAT;
    case SL_DTYPE_F64: return MPI_DOUBLE;
    case SL_DTYPE_I32: return MPI_INT32_T;
    case SL_DTYPE_I64: return MPI_INT64_T;
    case SL_DTYPE_U8: return MPI_UINT8_T;
    }
    return MPI_DATATYPE_NULL;
}

static MPI_Op mpi_op(sl_reduce_op op) {
    switch (op) {
    case SL_OP_SUM: return MPI_SUM;
    case SL_OP_MAX: return MPI_MAX;
    case SL_OP_MIN: return MPI_MIN;
    }
    return MPI_OP_NULL;
}

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }
static size_t chunks_of(size_t count) { return (count + max_chunk - 1) / max_chunk; }

// ---- lifetime --------------------------------------------------------------------------------------

static int new_group(sl_comm *c, MPI_Comm comm) {
    mpi_group *g = sl_malloc(sizeof *g, "MPI group");
    if (!g) {
        MPI_Comm_free(&comm);
        return -1;
    }
    g->comm = comm;
    c->impl = g;
    live_groups++;
    if (mpi_check(c, "MPI_Comm_set_errhandler", MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN))) return -1;
    if (mpi_check(c, "MPI_Comm_rank", MPI_Comm_rank(comm, &c->rank))) return -1;
    if (mpi_check(c, "MPI_Comm_size", MPI_Comm_size(comm, &c->size))) return -1;
    return 0;
}

static void finalize_if_done(void) {
    if (world_freed && live_groups == 0 && we_initialised) {
        MPI_Finalize();
        we_initialised = 0;
    }
}

static void mpi_free(sl_comm *c) {
    mpi_group *g = c->impl;
    if (g) {
        if (g->comm != MPI_COMM_NULL) MPI_Comm_free(&g->comm);
        free(g);
        c->impl = NULL;
        live_groups--;
    }
    if (c->is_world) world_freed = 1;
    finalize_if_done();
}

int sl_comm_mpi_init_world(sl_comm *world, int *argc, char ***argv) {
    int initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    if (finalised) return sl_errorf("comm backend mpi: MPI was already finalised in this process; it can be started only once");
    if (!initialised) {
        int provided = 0;
        int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) {
            char s[MPI_MAX_ERROR_STRING];
            error_string(rc, s, sizeof s);
            return sl_errorf("comm backend mpi: MPI_Init_thread failed: %s", s);
        }
        we_initialised = 1;
        world_freed = 0;
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        if (provided < MPI_THREAD_FUNNELED) {
            MPI_Finalize();
            we_initialised = 0;
            return sl_errorf("comm backend mpi: MPI provides thread level %d, below MPI_THREAD_FUNNELED (%d)", provided,
                             MPI_THREAD_FUNNELED);
        }
    }
    world->rank = 0;
    world->size = 1;
    MPI_Comm dup = MPI_COMM_NULL;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    if (rc == MPI_SUCCESS && new_group(world, dup) == 0) return 0;
    if (rc != MPI_SUCCESS) mpi_check(world, "MPI_Comm_dup", rc);
    // Undo: free what exists, finalise iff we initialised (the world was never handed out).
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", sl_error());
    world->is_world = 1;
    mpi_free(world);
    return sl_errorf("%s", msg);
}

static int mpi_split(sl_comm *parent, int color, int key, sl_comm *child, int *member) {
    MPI_Comm out = MPI_COMM_NULL;
    if (mpi_check(parent, "MPI_Comm_split",
                  MPI_Comm_split(comm_of(parent), color < 0 ? MPI_UNDEFINED : color, key, &out)))
        return -1;
    if (out == MPI_COMM_NULL) {
        *member = 0;
        return 0;
    }
    *member = 1;
    child->rank = parent->rank;
    child->size = parent->size;
    if (new_group(child, out)) {
        mpi_free(child);
        return -1;
    }
    return 0;
}

// ---- non-blocking requests -------------------------------------------------------------------------

typedef struct {
    sl_request_impl base;
    char what[32], group[SL_COMM_NAME_MAX];
    int rank, size;
    void *tmp, *dst;   // on completion copy tmp_bytes from tmp to dst, then free tmp
    size_t tmp_bytes;
    int *ints;         // int counts/displacements of a v-form, alive until completion (MPI's rule)
    int n, started;
    MPI_Request reqs[];
} mpi_request;

static void request_free(mpi_request *r) {
    free(r->tmp);
    free(r->ints);
    free(r);
}

static int request_fail(mpi_request *r, const char *call, int rc) {
    char s[MPI_MAX_ERROR_STRING];
    error_string(rc, s, sizeof s);
    sl_errorf("%s (%s) on group %s (rank %d of %d) failed: %s", call, r->what, r->group, r->rank, r->size, s);
    request_free(r);
    return -1;
}

static void request_finish(mpi_request *r) {
    if (r->tmp) memcpy(r->dst, r->tmp, r->tmp_bytes);
    request_free(r);
}

static int request_wait(sl_request_impl *base) {
    mpi_request *r = (mpi_request *)base;
    int rc = MPI_Waitall(r->started, r->reqs, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return request_fail(r, "MPI_Waitall", rc);
    request_finish(r);
    return 0;
}

static int request_test(sl_request_impl *base, int *done) {
    mpi_request *r = (mpi_request *)base;
    int flag = 0;
    int rc = MPI_Testall(r->started, r->reqs, &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
        *done = 1;
        return request_fail(r, "MPI_Testall", rc);
    }
    *done = flag;
    if (flag) request_finish(r);
    return 0;
}

static mpi_request *request_new(const sl_comm *c, const char *what, size_t n) {
    if (n > INT_MAX) {
        sl_errorf("%s on group %s (rank %d of %d): %zu MPI requests are too many", what, c->name, c->rank, c->size, n);
        return NULL;
    }
    mpi_request *r = sl_calloc(1, sizeof *r + n * sizeof(MPI_Request), "MPI request");
    if (!r) return NULL;
    r->base.wait = request_wait;
    r->base.test = request_test;
    snprintf(r->what, sizeof r->what, "%s", what);
    snprintf(r->group, sizeof r->group, "%s", c->name);
    r->rank = c->rank;
    r->size = c->size;
    r->n = (int)n;
    for (size_t i = 0; i < n; i++) r->reqs[i] = MPI_REQUEST_NULL;
    return r;
}

// A start call failed after `started` operations began: let those finish (MPI cannot cancel
// collectives), then report the failure of the start call.
static int request_abandon(const sl_comm *c, mpi_request *r, const char *call, int rc) {
    if (r->started) MPI_Waitall(r->started, r->reqs, MPI_STATUSES_IGNORE);
    request_free(r);
    return mpi_check(c, call, rc);
}

// ---- collectives: blocking when req == NULL, else started into req ------------------------------

static int do_allreduce(sl_comm *c, void *buf, size_t count, sl_dtype dtype, sl_reduce_op op, mpi_request *req) {
    size_t es = sl_dtype_size(dtype);
    MPI_Datatype t = mpi_type(dtype);
    for (size_t off = 0; off < count; off += max_chunk) {
        int n = (int)min_size(count - off, max_chunk);
        char *p = (char *)buf + off * es;
        if (req) {
            int rc = MPI_Iallreduce(MPI_IN_PLACE, p, n, t, mpi_op(op), comm_of(c), &req->reqs[req->started]);
            if (rc != MPI_SUCCESS) return request_abandon(c, req, "MPI_Iallreduce", rc);
            req->started++;
        } else if (mpi_check(c, "MPI_Allreduce", MPI_Allreduce(MPI_IN_PLACE, p, n, t, mpi_op(op), comm_of(c)))) {
            return -1;
        }
    }
    return 0;
}

static int do_reduce_scatter(sl_comm *c, const void *send, void *recv, size_t recv_count, sl_dtype dtype,
                             sl_reduce_op op, mpi_request *req) {
    size_t es = sl_dtype_size(dtype);
    MPI_Datatype t = mpi_type(dtype);
    int in_place = (const char *)recv == (const char *)send + (size_t)c->rank * recv_count * es;
    if (recv_count <= max_chunk) {
        void *out = recv;
        void *tmp = NULL;
        if (in_place) {
            tmp = sl_malloc(recv_count * es, "in-place reduce_scatter block");
            if (!tmp) {
                if (req) request_free(req);
                return -1;
            }
            out = tmp;
        }
        int rc;
        if (req) {
            rc = MPI_Ireduce_scatter_block(send, out, (int)recv_count, t, mpi_op(op), comm_of(c), &req->reqs[0]);
            if (rc != MPI_SUCCESS) {
                free(tmp);
                return request_abandon(c, req, "MPI_Ireduce_scatter_block", rc);
            }
            req->started = 1;
            req->tmp = tmp;
            req->dst = recv;
            req->tmp_bytes = recv_count * es;
            return 0;
        }
        rc = MPI_Reduce_scatter_block(send, out, (int)recv_count, t, mpi_op(op), comm_of(c));
        if (rc == MPI_SUCCESS && tmp) memcpy(recv, tmp, recv_count * es);
        free(tmp);
        return mpi_check(c, "MPI_Reduce_scatter_block", rc);
    }
    // Large blocks: reduce each block's slices to their owner. The owner reduces in place into its
    // own block when the buffers coincide.
    for (int root = 0; root < c->size; root++) {
        const char *block = (const char *)send + (size_t)root * recv_count * es;
        for (size_t off = 0; off < recv_count; off += max_chunk) {
            int n = (int)min_size(recv_count - off, max_chunk);
            const void *s = block + off * es;
            void *r = NULL;
            if (root == c->rank) {
                r = (char *)recv + off * es;
                if (in_place) s = MPI_IN_PLACE;
            }
            if (req) {
                int rc = MPI_Ireduce(s, r, n, t, mpi_op(op), root, comm_of(c), &req->reqs[req->started]);
                if (rc != MPI_SUCCESS) return request_abandon(c, req, "MPI_Ireduce", rc);
                req->started++;
            } else if (mpi_check(c, "MPI_Reduce", MPI_Reduce(s, r, n, t, mpi_op(op), root, comm_of(c)))) {
                return -1;
            }
        }
    }
    return 0;
}

static size_t reduce_scatter_requests(const sl_comm *c, size_t recv_count) {
    return recv_count <= max_chunk ? 1 : (size_t)c->size * chunks_of(recv_count);
}

static int do_allgather(sl_comm *c, const void *send, void *recv, size_t send_count, sl_dtype dtype,
                        mpi_request *req) {
    size_t es = sl_dtype_size(dtype);
    MPI_Datatype t = mpi_type(dtype);
    int in_place = (const char *)send == (const char *)recv + (size_t)c->rank * send_count * es;
    if (send_count <= max_chunk) {
        const void *s = in_place ? MPI_IN_PLACE : send;
        int n = (int)send_count;
        if (req) {
            int rc = MPI_Iallgather(s, n, t, recv, n, t, comm_of(c), &req->reqs[0]);
            if (rc != MPI_SUCCESS) return request_abandon(c, req, "MPI_Iallgather", rc);
            req->started = 1;
            return 0;
        }
        return mpi_check(c, "MPI_Allgather", MPI_Allgather(s, n, t, recv, n, t, comm_of(c)));
    }
    // Large blocks: slice k of every block at once, through a datatype of the slice's length whose
    // extent is one whole block, so rank r's slice lands at recv + r * send_count + off.
    for (size_t off = 0; off < send_count; off += max_chunk) {
        int n = (int)min_size(send_count - off, max_chunk);
        MPI_Datatype slice = MPI_DATATYPE_NULL, block = MPI_DATATYPE_NULL;
        int rc = MPI_Type_contiguous(n, t, &slice);
        if (rc == MPI_SUCCESS) rc = MPI_Type_create_resized(slice, 0, (MPI_Aint)(send_count * es), &block);
        if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&block);
        if (rc != MPI_SUCCESS) {
            if (slice != MPI_DATATYPE_NULL) MPI_Type_free(&slice);
            if (block != MPI_DATATYPE_NULL) MPI_Type_free(&block);
            return req ? request_abandon(c, req, "MPI_Type_create_resized", rc)
                       : mpi_check(c, "MPI_Type_create_resized", rc);
        }
        const void *s = in_place ? MPI_IN_PLACE : (const char *)send + off * es;
        char *r = (char *)recv + off * es;
        if (req) {
            rc = MPI_Iallgather(s, n, t, r, 1, block, comm_of(c), &req->reqs[req->started]);
            if (rc == MPI_SUCCESS) req->started++;
        } else {
            rc = MPI_Allgather(s, n, t, r, 1, block, comm_of(c));
        }
        // Freeing a datatype in use by a pending operation is allowed: MPI frees it afterwards.
        MPI_Type_free(&slice);
        MPI_Type_free(&block);
        if (rc != MPI_SUCCESS)
            return req ? request_abandon(c, req, "MPI_Iallgather", rc) : mpi_check(c, "MPI_Allgather", rc);
    }
    return 0;
}

static int do_broadcast(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int root, mpi_request *req) {
    size_t es = sl_dtype_size(dtype);
    MPI_Datatype t = mpi_type(dtype);
    for (size_t off = 0; off < count; off += max_chunk) {
        int n = (int)min_size(count - off, max_chunk);
        char *p = (char *)buf + off * es;
        if (req) {
            int rc = MPI_Ibcast(p, n, t, root, comm_of(c), &req->reqs[req->started]);
            if (rc != MPI_SUCCESS) return request_abandon(c, req, "MPI_Ibcast", rc);
            req->started++;
        } else if (mpi_check(c, "MPI_Bcast", MPI_Bcast(p, n, t, root, comm_of(c)))) {
            return -1;
        }
    }
    return 0;
}

// ---- variable-count forms: one MPI call each (comm.c has checked every count and displacement
// against INT_MAX). Blocking when impl == NULL, else started into a new request that owns the int
// arrays MPI reads until completion.

// 2 * size ints: counts (cast) then displs (cast; NULL displs: the prefix sums of counts).
static int *int_arrays(const sl_comm *c, const size_t *counts, const size_t *displs) {
    int *a = sl_malloc(2 * (size_t)c->size * sizeof(int), "MPI counts");
    if (!a) return NULL;
    size_t off = 0;
    for (int r = 0; r < c->size; r++) {
        a[r] = (int)counts[r];
        a[c->size + r] = (int)(displs ? displs[r] : off);
        off += counts[r];
    }
    return a;
}

static int mpi_allgatherv(sl_comm *c, const void *send, void *recv, const size_t *counts, const size_t *displs,
                          sl_dtype dtype, sl_request_impl **impl) {
    size_t es = sl_dtype_size(dtype);
    MPI_Datatype t = mpi_type(dtype);
    int in_place = counts[c->rank] > 0 && (const char *)send == (const char *)recv + displs[c->rank] * es;
    const void *s = in_place ? MPI_IN_PLACE : send;
    int n = (int)counts[c->rank];
    int *a = int_arrays(c, counts, displs);
    if (!a) return -1;
    if (!impl) {
        int rc = MPI_Allgatherv(s, n, t, recv, a, a + c->size, t, comm_of(c));
        free(a);
        return mpi_check(c, "MPI_Allgatherv", rc);
    }
    mpi_request *r = request_new(c, "allgatherv", 1);
    if (!r) {
        free(a);
        return -1;
    }
    r->ints = a;
    int rc = MPI_Iallgatherv(s, n, t, recv, a, a + c->size, t, comm_of(c), &r->reqs[0]);
    if (rc != MPI_SUCCESS) return request_abandon(c, r, "MPI_Iallgatherv", rc);
    r->started = 1;
    *impl = &r->base;
    return 0;
}

static int mpi_reduce_scatterv(sl_comm *c, const void *send, void *recv, const size_t *counts, sl_dtype dtype,
                               sl_reduce_op op, sl_request_impl **impl) {
    MPI_Datatype t = mpi_type(dtype);
    int *a = int_arrays(c, counts, NULL);
    if (!a) return -1;
    if (!impl) {
        int rc = MPI_Reduce_scatter(send, recv, a, t, mpi_op(op), comm_of(c));
        free(a);
        return mpi_check(c, "MPI_Reduce_scatter", rc);
    }
    mpi_request *r = request_new(c, "reduce_scatterv", 1);
    if (!r) {
        free(a);
        return -1;
    }
    r->ints = a;
    int rc = MPI_Ireduce_scatter(send, recv, a, t, mpi_op(op), comm_of(c), &r->reqs[0]);
    if (rc != MPI_SUCCESS) return request_abandon(c, r, "MPI_Ireduce_scatter", rc);
    r->started = 1;
    *impl = &r->base;
    return 0;
}

// ---- vtable entries --------------------------------------------------------------------------------

static int mpi_allreduce(sl_comm *c, void *buf, size_t count, sl_dtype dtype, sl_reduce_op op) {
    return do_allreduce(c, buf, count, dtype, op, NULL);
}

static int mpi_reduce_scatter(sl_comm *c, const void *send, void *recv, size_t recv_count, sl_dtype dtype,
                              sl_reduce_op op) {
    return do_reduce_scatter(c, send, recv, recv_count, dtype, op, NULL);
}

static int mpi_allgather(sl_comm *c, const void *send, void *recv, size_t send_count, sl_dtype dtype) {
    return do_allgather(c, send, recv, send_count, dtype, NULL);
}

static int mpi_broadcast(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int root) {
    return do_broadcast(c, buf, count, dtype, root, NULL);
}

static int mpi_barrier(sl_comm *c) { return mpi_check(c, "MPI_Barrier", MPI_Barrier(comm_of(c))); }

static int mpi_send(sl_comm *c, const void *buf, size_t count, sl_dtype dtype, int peer, int tag) {
    size_t es = sl_dtype_size(dtype);
    size_t off = 0;
    do {   // a zero-length message is still sent, so it pairs with the peer's zero-length recv
        int n = (int)min_size(count - off, max_chunk);
        if (mpi_check(c, "MPI_Send", MPI_Send((const char *)buf + off * es, n, mpi_type(dtype), peer, tag, comm_of(c))))
            return -1;
        off += (size_t)n;
    } while (off < count);
    return 0;
}

static int mpi_recv(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int peer, int tag) {
    size_t es = sl_dtype_size(dtype);
    size_t off = 0;
    do {
        int n = (int)min_size(count - off, max_chunk);
        MPI_Status st;
        if (mpi_check(c, "MPI_Recv", MPI_Recv((char *)buf + off * es, n, mpi_type(dtype), peer, tag, comm_of(c), &st)))
            return -1;
        int got = 0;
        if (mpi_check(c, "MPI_Get_count", MPI_Get_count(&st, mpi_type(dtype), &got))) return -1;
        if (got != n)
            return sl_errorf("MPI_Recv on group %s (rank %d of %d): expected %d %s elements from rank %d (tag %d), got %d",
                             c->name, c->rank, c->size, n, sl_dtype_name(dtype), peer, tag, got);
        off += (size_t)n;
    } while (off < count);
    return 0;
}

static int mpi_iallreduce(sl_comm *c, void *buf, size_t count, sl_dtype dtype, sl_reduce_op op,
                          sl_request_impl **impl) {
    mpi_request *r = request_new(c, "allreduce", chunks_of(count));
    if (!r) return -1;
    if (do_allreduce(c, buf, count, dtype, op, r)) return -1;
    *impl = &r->base;
    return 0;
}

static int mpi_ireduce_scatter(sl_comm *c, const void *send, void *recv, size_t recv_count, sl_dtype dtype,
                               sl_reduce_op op, sl_request_impl **impl) {
    mpi_request *r = request_new(c, "reduce_scatter", reduce_scatter_requests(c, recv_count));
    if (!r) return -1;
    if (do_reduce_scatter(c, send, recv, recv_count, dtype, op, r)) return -1;
    *impl = &r->base;
    return 0;
}

static int mpi_iallgather(sl_comm *c, const void *send, void *recv, size_t send_count, sl_dtype dtype,
                          sl_request_impl **impl) {
    mpi_request *r = request_new(c, "allgather", chunks_of(send_count));
    if (!r) return -1;
    if (do_allgather(c, send, recv, send_count, dtype, r)) return -1;
    *impl = &r->base;
    return 0;
}

static int mpi_ibroadcast(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int root, sl_request_impl **impl) {
    mpi_request *r = request_new(c, "broadcast", chunks_of(count));
    if (!r) return -1;
    if (do_broadcast(c, buf, count, dtype, root, r)) return -1;
    *impl = &r->base;
    return 0;
}

const sl_comm_vtable sl_comm_mpi_vtable = {
    .split = mpi_split,
    .free = mpi_free,
    .allreduce = mpi_allreduce,
    .reduce_scatter = mpi_reduce_scatter,
    .allgather = mpi_allgather,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .send = mpi_send,
    .recv = mpi_recv,
    .iallreduce = mpi_iallreduce,
    .ireduce_scatter = mpi_ireduce_scatter,
    .iallgather = mpi_iallgather,
    .ibroadcast = mpi_ibroadcast,
    .allgatherv = mpi_allgatherv,
    .reduce_scatterv = mpi_reduce_scatterv,
};
