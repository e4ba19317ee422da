// comm.c: the public comm.h entry points. Owns backend selection ("self" / "mpi" / "nccl" / "auto"),
// argument validation, group names, request bookkeeping and the per-group byte counter; the
// backends (comm_self.c, comm_mpi.c, comm_nccl.c when built with SHARDLM_HAVE_NCCL) only move data.
//
// Invariants:
// - A backend function is called only with validated arguments (see comm_internal.h).
// - Every error message names the operation, the group and the rank: "sl_comm_broadcast on group dp
//   (rank 1 of 2): root 5 out of range [0, 2)".
// - bytes_sent grows only after a call succeeds, by the payload this process contributes:
//   allreduce count, reduce_scatter size * recv_count (its whole input), allgather send_count,
//   allgatherv counts[rank], reduce_scatterv sum(counts) (its whole input),
//   broadcast count on the root (0 elsewhere), send count; recv and barrier add nothing. Counts are
//   multiplied by the element size; the same rule holds for every backend, self included.
// - A request is complete exactly when req->impl == NULL; then req->done == 1.
#include "comm/comm_internal.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shardlm/error.h"
#include "shardlm/launch_env.h"

int sl_comm_nccl_built(void) {
#ifdef SHARDLM_HAVE_NCCL
    return 1;
#else
    return 0;
#endif
}

size_t sl_dtype_size(sl_dtype dtype) {
    switch (dtype) {
    case SL_DTYPE_F32: return 4;
    case SL_DTYPE_F64: return 8;
    case SL_DTYPE_I32: return 4;
    case SL_DTYPE_I64: return 8;
    case SL_DTYPE_U8: return 1;
    }
    return 0;
}

const char *sl_dtype_name(sl_dtype dtype) {
    switch (dtype) {
    case SL_DTYPE_F32: return "f32";
    case SL_DTYPE_F64: return "f64";
    case SL_DTYPE_I32: return "i32";
    case SL_DTYPE_I64: return "i64";
    case SL_DTYPE_U8: return "u8";
    }
    return "invalid";
}

const char *sl_reduce_op_name(sl_reduce_op op) {
    switch (op) {
    case SL_OP_SUM: return "sum";
    case SL_OP_MAX: return "max";
    case SL_OP_MIN: return "min";
    }
    return "invalid";
}

// ---- validation helpers: each returns -1 with a message naming the call, group and rank --------

#define GROUP_FMT "%s on group %s (rank %d of %d)"
#define GROUP_ARGS(what, c) what, (c)->name, (c)->rank, (c)->size

static int check_comm(const sl_comm *c, const char *what) {
    if (!c) return sl_errorf("%s: group is NULL", what);
    return 0;
}

static int check_dtype(const sl_comm *c, const char *what, sl_dtype dtype) {
    if (sl_dtype_size(dtype) == 0)
        return sl_errorf(GROUP_FMT ": invalid dtype %d", GROUP_ARGS(what, c), (int)dtype);
    return 0;
}

static int check_op(const sl_comm *c, const char *what, sl_reduce_op op) {
    if (op != SL_OP_SUM && op != SL_OP_MAX && op != SL_OP_MIN)
        return sl_errorf(GROUP_FMT ": invalid reduce op %d", GROUP_ARGS(what, c), (int)op);
    return 0;
}

static int check_buf(const sl_comm *c, const char *what, const char *which, const void *p, size_t count) {
    if (count > 0 && !p) return sl_errorf(GROUP_FMT ": %s buffer is NULL for %zu elements", GROUP_ARGS(what, c), which, count);
    return 0;
}

// count * size elements of dtype must fit in size_t bytes.
static int check_total(const sl_comm *c, const char *what, size_t count, size_t blocks, sl_dtype dtype, size_t *bytes) {
    size_t es = sl_dtype_size(dtype);
    if (blocks && count > SIZE_MAX / blocks / es)
        return sl_errorf(GROUP_FMT ": %zu x %zu elements overflow the address space", GROUP_ARGS(what, c), blocks, count);
    *bytes = count * blocks * es;
    return 0;
}

static int check_rank_arg(const sl_comm *c, const char *what, const char *which, int r) {
    if (r < 0 || r >= c->size)
        return sl_errorf(GROUP_FMT ": %s %d out of range [0, %d)", GROUP_ARGS(what, c), which, r, c->size);
    return 0;
}

// A block buffer `big` (blocks * block_bytes) and a one-block buffer `small`: either disjoint, or
// small == big + rank * block_bytes (in place). Anything else is an error.
static int check_in_place(const sl_comm *c, const char *what, const void *big, size_t big_bytes, const void *small,
                          size_t block_bytes, const char *form) {
    if (!big || !small || big_bytes == 0) return 0;
    uintptr_t b = (uintptr_t)big, s = (uintptr_t)small;
    int disjoint = s + block_bytes <= b || b + big_bytes <= s;
    if (disjoint) return 0;
    if (s == b + (uintptr_t)c->rank * block_bytes) return 0;
    return sl_errorf(GROUP_FMT ": send and recv buffers overlap, but not in the in-place form (%s)", GROUP_ARGS(what, c),
                     form);
}

static int check_req(const sl_comm *c, const char *what, const sl_comm_request *req) {
    if (!req) return sl_errorf(GROUP_FMT ": request is NULL", GROUP_ARGS(what, c));
    return 0;
}

static void req_started(sl_comm_request *req, sl_request_impl *impl) {
    req->impl = impl;
    req->done = impl == NULL;
}

// ---- world, groups ---------------------------------------------------------------------------

static sl_comm *comm_alloc(const sl_comm_vtable *vt, sl_comm_backend backend, const char *name) {
    sl_comm *c = sl_calloc(1, sizeof *c, "communication group");
    if (!c) return NULL;
    c->vt = vt;
    c->backend = backend;
    snprintf(c->name, sizeof c->name, "%s", name);
    return c;
}

int sl_comm_choose_backend(const char *backend_name, sl_comm_backend *backend, int *world_size) {
    const char *name = backend_name ? backend_name : "auto";
    sl_launch_env env;
    *world_size = 0;
    if (strcmp(name, "self") == 0) {
        *backend = SL_COMM_SELF;
        *world_size = 1;
    } else if (strcmp(name, "mpi") == 0 || strcmp(name, "nccl") == 0) {
        *backend = name[0] == 'm' ? SL_COMM_MPI : SL_COMM_NCCL;
        if (sl_launch_env_detect(&env) == 0) *world_size = env.world_size;
    } else if (strcmp(name, "auto") == 0) {
        if (sl_launch_env_detect(&env)) return sl_error_context("choosing the comm backend");
        *backend = env.world_size > 1 ? SL_COMM_MPI : SL_COMM_SELF;
        *world_size = env.world_size;
    } else {
        return sl_errorf("unknown comm backend \"%s\" (expected self, mpi, nccl or auto)", name);
    }
    return 0;
}

int sl_comm_init_world(sl_comm **world, const char *backend_name, int *argc, char ***argv) {
    if (!world) return sl_errorf("sl_comm_init_world: world is NULL");
    *world = NULL;
    const char *name = backend_name ? backend_name : "auto";
    sl_comm_backend backend;
    int env_world;
    if (sl_comm_choose_backend(name, &backend, &env_world)) return -1;
    const sl_comm_vtable *vt = backend == SL_COMM_MPI ? &sl_comm_mpi_vtable : &sl_comm_self_vtable;
    if (backend == SL_COMM_NCCL) {
#ifdef SHARDLM_HAVE_NCCL
        vt = &sl_comm_nccl_vtable;
#else
        return sl_errorf("comm backend \"nccl\": this binary was built without NCCL (no CUDA nccl.h / libnccl at "
                         "build time; available: self, mpi, auto)");
#endif
    }

    sl_comm *c = comm_alloc(vt, backend, "world");
    if (!c) return -1;
    c->is_world = 1;
    int rc;
    if (backend == SL_COMM_MPI) rc = sl_comm_mpi_init_world(c, argc, argv);
#ifdef SHARDLM_HAVE_NCCL
    else if (backend == SL_COMM_NCCL) rc = sl_comm_nccl_init_world(c, argc, argv);
#endif
    else rc = sl_comm_self_init_world(c);
    if (rc) {
        free(c);
        return -1;
    }
    // Under "auto" the launcher told us the world; MPI must agree, or the job was started by a
    // launcher MPI cannot join (e.g. torchrun), and every process would train alone.
    sl_launch_env env;
    if (strcmp(name, "auto") == 0 && backend == SL_COMM_MPI && sl_launch_env_detect(&env) == 0 &&
        (c->size != env.world_size || c->rank != env.rank)) {
        int mr = c->rank, ms = c->size;
        sl_comm_free(c);
        return sl_errorf("comm backend auto: %s set rank %d of %d, but MPI reports rank %d of %d (an MPI job must be "
                         "started by mpirun or srun)",
                         sl_launcher_name(env.launcher), env.rank, env.world_size, mr, ms);
    }
    *world = c;
    return 0;
}

void sl_comm_free(sl_comm *comm) {
    if (!comm) return;
    comm->vt->free(comm);
    free(comm);
}

int sl_comm_rank(const sl_comm *comm) { return comm ? comm->rank : 0; }
int sl_comm_size(const sl_comm *comm) { return comm ? comm->size : 1; }
sl_comm_backend sl_comm_backend_of(const sl_comm *comm) { return comm ? comm->backend : SL_COMM_SELF; }
const char *sl_comm_name(const sl_comm *comm) { return comm ? comm->name : "(none)"; }
size_t sl_comm_bytes_sent(const sl_comm *c) { return c ? c->bytes_sent : 0; }

int sl_comm_split(sl_comm *parent, int color, int key, const char *name, sl_comm **out) {
    const char *what = "sl_comm_split";
    if (check_comm(parent, what)) return -1;
    if (!out) return sl_errorf(GROUP_FMT ": out is NULL", GROUP_ARGS(what, parent));
    *out = NULL;
    if (!name || !name[0] || strlen(name) >= SL_COMM_NAME_MAX)
        return sl_errorf(GROUP_FMT ": group name must have 1 to %d characters", GROUP_ARGS(what, parent),
                         SL_COMM_NAME_MAX - 1);
    sl_comm *c = comm_alloc(parent->vt, parent->backend, name);
    if (!c) return -1;
    int member = 1;
    if (parent->vt->split(parent, color, key, c, &member)) {
        free(c);
        return sl_error_context("creating group %s", name);
    }
    if (!member) {
        free(c);
        return 0;
    }
    *out = c;
    return 0;
}

// ---- blocking collectives ------------------------------------------------------------------------

int sl_comm_allreduce(sl_comm *c, void *buf, size_t count, sl_dtype dtype, sl_reduce_op op) {
    const char *what = "sl_comm_allreduce";
    size_t bytes = 0;
    if (check_comm(c, what) || check_dtype(c, what, dtype) || check_op(c, what, op) || check_buf(c, what, "data", buf, count) ||
        check_total(c, what, count, 1, dtype, &bytes))
        return -1;
    if (count == 0) return 0;
    if (c->vt->allreduce(c, buf, count, dtype, op)) return -1;
    c->bytes_sent += bytes;
    return 0;
}

static int check_reduce_scatter(sl_comm *c, const char *what, const void *send, void *recv, size_t recv_count,
                                sl_dtype dtype, sl_reduce_op op, size_t *bytes) {
    if (check_comm(c, what) || check_dtype(c, what, dtype) || check_op(c, what, op) ||
        check_buf(c, what, "send", send, recv_count) || check_buf(c, what, "recv", recv, recv_count) ||
        check_total(c, what, recv_count, (size_t)c->size, dtype, bytes))
        return -1;
    return check_in_place(c, what, send, *bytes, recv, recv_count * sl_dtype_size(dtype),
                          "recv == send + rank * recv_count");
}

int sl_comm_reduce_scatter(sl_comm *c, const void *send, void *recv, size_t recv_count, sl_dtype dtype,
                           sl_reduce_op op) {
    size_t bytes = 0;
    if (check_reduce_scatter(c, "sl_comm_reduce_scatter", send, recv, recv_count, dtype, op, &bytes)) return -1;
    if (recv_count == 0) return 0;
    if (c->vt->reduce_scatter(c, send, recv, recv_count, dtype, op)) return -1;
    c->bytes_sent += bytes;
    return 0;
}

static int check_allgather(sl_comm *c, const char *what, const void *send, void *recv, size_t send_count,
                           sl_dtype dtype, size_t *bytes) {
    size_t total = 0;
    if (check_comm(c, what) || check_dtype(c, what, dtype) || check_buf(c, what, "send", send, send_count) ||
        check_buf(c, what, "recv", recv, send_count) || check_total(c, what, send_count, (size_t)c->size, dtype, &total))
        return -1;
    *bytes = send_count * sl_dtype_size(dtype);
    return check_in_place(c, what, recv, total, send, *bytes, "send == recv + rank * send_count");
}

int sl_comm_allgather(sl_comm *c, const void *send, void *recv, size_t send_count, sl_dtype dtype) {
    size_t bytes = 0;
    if (check_allgather(c, "sl_comm_allgather", send, recv, send_count, dtype, &bytes)) return -1;
    if (send_count == 0) return 0;
    if (c->vt->allgather(c, send, recv, send_count, dtype)) return -1;
    c->bytes_sent += bytes;
    return 0;
}

static int check_broadcast(sl_comm *c, const char *what, void *buf, size_t count, sl_dtype dtype, int root,
                           size_t *bytes) {
    if (check_comm(c, what) || check_dtype(c, what, dtype) || check_buf(c, what, "data", buf, count) ||
        check_rank_arg(c, what, "root", root) || check_total(c, what, count, 1, dtype, bytes))
        return -1;
    if (c->rank != root) *bytes = 0;
    return 0;
}

int sl_comm_broadcast(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int root) {
    size_t bytes = 0;
    if (check_broadcast(c, "sl_comm_broadcast", buf, count, dtype, root, &bytes)) return -1;
    if (count == 0) return 0;
    if (c->vt->broadcast(c, buf, count, dtype, root)) return -1;
    c->bytes_sent += bytes;
    return 0;
}

int sl_comm_barrier(sl_comm *c) {
    if (check_comm(c, "sl_comm_barrier")) return -1;
    return c->vt->barrier(c);
}

static int check_p2p(sl_comm *c, const char *what, const void *buf, size_t count, sl_dtype dtype, int peer, int tag,
                     size_t *bytes) {
    if (check_comm(c, what) || check_dtype(c, what, dtype) || check_buf(c, what, "data", buf, count) ||
        check_rank_arg(c, what, "peer", peer) || check_total(c, what, count, 1, dtype, bytes))
        return -1;
    if (tag < 0 || tag > 32767)  // 32767 is the smallest MPI_TAG_UB the standard allows
        return sl_errorf(GROUP_FMT ": tag %d out of range [0, 32767]", GROUP_ARGS(what, c), tag);
    if (peer == c->rank)
        return sl_errorf(GROUP_FMT ": peer %d is this rank; a blocking send/recv to oneself would deadlock",
                         GROUP_ARGS(what, c), peer);
    return 0;
}

int sl_comm_send(sl_comm *c, const void *buf, size_t count, sl_dtype dtype, int peer, int tag) {
    size_t bytes = 0;
    if (check_p2p(c, "sl_comm_send", buf, count, dtype, peer, tag, &bytes)) return -1;
    if (c->vt->send(c, buf, count, dtype, peer, tag)) return -1;
    c->bytes_sent += bytes;
    return 0;
}

int sl_comm_recv(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int peer, int tag) {
    size_t bytes = 0;
    if (check_p2p(c, "sl_comm_recv", buf, count, dtype, peer, tag, &bytes)) return -1;
    return c->vt->recv(c, buf, count, dtype, peer, tag);
}

// ---- variable-count forms ----------------------------------------------------------------------

static int check_v_entry(const sl_comm *c, const char *what, const char *array, int r, size_t v) {
    if (v > (size_t)INT_MAX)
        return sl_errorf(GROUP_FMT ": %s[%d] = %zu exceeds INT_MAX (%d); the variable-count collectives take at "
                         "most INT_MAX elements per block and offset",
                         GROUP_ARGS(what, c), array, r, v, INT_MAX);
    return 0;
}

typedef struct {
    size_t displ, count;
    int rank;
} v_block;

static int v_block_cmp(const void *a, const void *b) {
    const v_block *x = a, *y = b;
    if (x->displ != y->displ) return x->displ < y->displ ? -1 : 1;
    return x->rank - y->rank;
}

// Validates allgatherv's arguments; *bytes = counts[rank] * element size, *any = some count > 0.
static int check_allgatherv(sl_comm *c, const char *what, const void *send, void *recv, const size_t *counts,
                            const size_t *displs, sl_dtype dtype, size_t *bytes, int *any) {
    if (check_comm(c, what) || check_dtype(c, what, dtype)) return -1;
    if (!counts) return sl_errorf(GROUP_FMT ": counts is NULL", GROUP_ARGS(what, c));
    if (!displs) return sl_errorf(GROUP_FMT ": displs is NULL", GROUP_ARGS(what, c));
    size_t es = sl_dtype_size(dtype), extent = 0, nonzero = 0;
    for (int r = 0; r < c->size; r++) {
        if (check_v_entry(c, what, "counts", r, counts[r]) || check_v_entry(c, what, "displs", r, displs[r])) return -1;
        if (counts[r] == 0) continue;
        nonzero++;
        size_t end = displs[r] + counts[r];   // both <= INT_MAX: no overflow
        if (end > extent) extent = end;
    }
    *any = nonzero > 0;
    *bytes = counts[c->rank] * es;
    if (extent > SIZE_MAX / es)
        return sl_errorf(GROUP_FMT ": %zu elements overflow the address space", GROUP_ARGS(what, c), extent);
    if (check_buf(c, what, "send", send, counts[c->rank]) || check_buf(c, what, "recv", recv, extent)) return -1;
    if (nonzero > 1) {   // blocks must not overlap: sort the non-empty ones by displacement
        v_block *b = sl_malloc(nonzero * sizeof *b, "allgatherv block list");
        if (!b) return sl_error_context(GROUP_FMT, GROUP_ARGS(what, c));
        size_t n = 0;
        for (int r = 0; r < c->size; r++)
            if (counts[r]) b[n++] = (v_block){displs[r], counts[r], r};
        qsort(b, n, sizeof *b, v_block_cmp);
        for (size_t i = 1; i < n; i++) {
            if (b[i - 1].displ + b[i - 1].count > b[i].displ) {
                int p = b[i - 1].rank, q = b[i].rank;
                free(b);
                return sl_errorf(GROUP_FMT ": blocks of ranks %d and %d overlap (displs[%d] = %zu, counts[%d] = %zu, "
                                 "displs[%d] = %zu)",
                                 GROUP_ARGS(what, c), p, q, p, displs[p], p, counts[p], q, displs[q]);
            }
        }
        free(b);
    }
    if (counts[c->rank] == 0 || !send || !recv) return 0;
    uintptr_t s = (uintptr_t)send, rb = (uintptr_t)recv;
    if (s + *bytes <= rb || rb + extent * es <= s) return 0;   // disjoint
    if (s == rb + (uintptr_t)(displs[c->rank] * es)) return 0;   // in place
    return sl_errorf(GROUP_FMT ": send and recv buffers overlap, but not in the in-place form (send == recv + "
                     "displs[rank])",
                     GROUP_ARGS(what, c));
}

int sl_comm_allgatherv(sl_comm *c, const void *send, void *recv, const size_t *counts, const size_t *displs,
                       sl_dtype dtype) {
    size_t bytes = 0;
    int any = 0;
    if (check_allgatherv(c, "sl_comm_allgatherv", send, recv, counts, displs, dtype, &bytes, &any)) return -1;
    if (!any) return 0;
    if (c->vt->allgatherv(c, send, recv, counts, displs, dtype, NULL)) return -1;
    c->bytes_sent += bytes;
    return 0;
}

// Validates reduce_scatterv's arguments; *bytes = sum(counts) * element size (the whole input).
static int check_reduce_scatterv(sl_comm *c, const char *what, const void *send, void *recv, const size_t *counts,
                                 sl_dtype dtype, sl_reduce_op op, size_t *bytes) {
    if (check_comm(c, what) || check_dtype(c, what, dtype) || check_op(c, what, op)) return -1;
    if (!counts) return sl_errorf(GROUP_FMT ": counts is NULL", GROUP_ARGS(what, c));
    size_t total = 0;
    for (int r = 0; r < c->size; r++) {
        if (check_v_entry(c, what, "counts", r, counts[r])) return -1;
        total += counts[r];
        if (total > (size_t)INT_MAX)
            return sl_errorf(GROUP_FMT ": counts[0..%d] sum to more than INT_MAX (%d) elements; reduce_scatterv takes "
                             "at most INT_MAX elements in all",
                             GROUP_ARGS(what, c), r, INT_MAX);
    }
    size_t es = sl_dtype_size(dtype);
    *bytes = total * es;   // total <= INT_MAX, es <= 8: no overflow
    if (check_buf(c, what, "send", send, total) || check_buf(c, what, "recv", recv, counts[c->rank])) return -1;
    size_t rbytes = counts[c->rank] * es;
    if (rbytes && total && send && recv) {
        uintptr_t s = (uintptr_t)send, rb = (uintptr_t)recv;
        if (!(rb + rbytes <= s || s + *bytes <= rb))
            return sl_errorf(GROUP_FMT ": recv overlaps send (reduce_scatterv has no in-place form)",
                             GROUP_ARGS(what, c));
    }
    return 0;
}

int sl_comm_reduce_scatterv(sl_comm *c, const void *send, void *recv, const size_t *counts, sl_dtype dtype,
                            sl_reduce_op op) {
    size_t bytes = 0;
    if (check_reduce_scatterv(c, "sl_comm_reduce_scatterv", send, recv, counts, dtype, op, &bytes)) return -1;
    if (bytes == 0) return 0;
    if (c->vt->reduce_scatterv(c, send, recv, counts, dtype, op, NULL)) return -1;
    c->bytes_sent += bytes;
    return 0;
}

// ---- non-blocking forms ------------------------------------------------------------------------

int sl_comm_iallreduce(sl_comm *c, void *buf, size_t count, sl_dtype dtype, sl_reduce_op op, sl_comm_request *req) {
    const char *what = "sl_comm_iallreduce";
    size_t bytes = 0;
    if (check_comm(c, what) || check_req(c, what, req)) return -1;
    req_started(req, NULL);
    if (check_dtype(c, what, dtype) || check_op(c, what, op) || check_buf(c, what, "data", buf, count) ||
        check_total(c, what, count, 1, dtype, &bytes))
        return -1;
    if (count == 0) return 0;
    sl_request_impl *impl = NULL;
    if (c->vt->iallreduce(c, buf, count, dtype, op, &impl)) return -1;
    req_started(req, impl);
    c->bytes_sent += bytes;
    return 0;
}

int sl_comm_ireduce_scatter(sl_comm *c, const void *send, void *recv, size_t recv_count, sl_dtype dtype,
                            sl_reduce_op op, sl_comm_request *req) {
    const char *what = "sl_comm_ireduce_scatter";
    size_t bytes = 0;
    if (check_comm(c, what) || check_req(c, what, req)) return -1;
    req_started(req, NULL);
    if (check_reduce_scatter(c, what, send, recv, recv_count, dtype, op, &bytes)) return -1;
    if (recv_count == 0) return 0;
    sl_request_impl *impl = NULL;
    if (c->vt->ireduce_scatter(c, send, recv, recv_count, dtype, op, &impl)) return -1;
    req_started(req, impl);
    c->bytes_sent += bytes;
    return 0;
}

int sl_comm_iallgather(sl_comm *c, const void *send, void *recv, size_t send_count, sl_dtype dtype,
                       sl_comm_request *req) {
    const char *what = "sl_comm_iallgather";
    size_t bytes = 0;
    if (check_comm(c, what) || check_req(c, what, req)) return -1;
    req_started(req, NULL);
    if (check_allgather(c, what, send, recv, send_count, dtype, &bytes)) return -1;
    if (send_count == 0) return 0;
    sl_request_impl *impl = NULL;
    if (c->vt->iallgather(c, send, recv, send_count, dtype, &impl)) return -1;
    req_started(req, impl);
    c->bytes_sent += bytes;
    return 0;
}

int sl_comm_ibroadcast(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int root, sl_comm_request *req) {
    const char *what = "sl_comm_ibroadcast";
    size_t bytes = 0;
    if (check_comm(c, what) || check_req(c, what, req)) return -1;
    req_started(req, NULL);
    if (check_broadcast(c, what, buf, count, dtype, root, &bytes)) return -1;
    if (count == 0) return 0;
    sl_request_impl *impl = NULL;
    if (c->vt->ibroadcast(c, buf, count, dtype, root, &impl)) return -1;
    req_started(req, impl);
    c->bytes_sent += bytes;
    return 0;
}

int sl_comm_iallgatherv(sl_comm *c, const void *send, void *recv, const size_t *counts, const size_t *displs,
                        sl_dtype dtype, sl_comm_request *req) {
    const char *what = "sl_comm_iallgatherv";
    size_t bytes = 0;
    int any = 0;
    if (check_comm(c, what) || check_req(c, what, req)) return -1;
    req_started(req, NULL);
    if (check_allgatherv(c, what, send, recv, counts, displs, dtype, &bytes, &any)) return -1;
    if (!any) return 0;
    sl_request_impl *impl = NULL;
    if (c->vt->allgatherv(c, send, recv, counts, displs, dtype, &impl)) return -1;
    req_started(req, impl);
    c->bytes_sent += bytes;
    return 0;
}

int sl_comm_ireduce_scatterv(sl_comm *c, const void *send, void *recv, const size_t *counts, sl_dtype dtype,
                             sl_reduce_op op, sl_comm_request *req) {
    const char *what = "sl_comm_ireduce_scatterv";
    size_t bytes = 0;
    if (check_comm(c, what) || check_req(c, what, req)) return -1;
    req_started(req, NULL);
    if (check_reduce_scatterv(c, what, send, recv, counts, dtype, op, &bytes)) return -1;
    if (bytes == 0) return 0;
    sl_request_impl *impl = NULL;
    if (c->vt->reduce_scatterv(c, send, recv, counts, dtype, op, &impl)) return -1;
    req_started(req, impl);
    c->bytes_sent += bytes;
    return 0;
}

int sl_comm_wait(sl_comm_request *req) {
    if (!req) return sl_errorf("sl_comm_wait: request is NULL");
    sl_request_impl *impl = req->impl;
    if (!impl) {
        req->done = 1;
        return 0;
    }
    int rc = impl->wait(impl);   // frees impl, also on failure
    req->impl = NULL;
    req->done = 1;
    return rc;
}

int sl_comm_order_after(sl_comm *c, void *stream) {
    if (check_comm(c, "sl_comm_order_after")) return -1;
    if (!stream || !c->vt->order_after) return 0;
    return c->vt->order_after(c, stream);
}

int sl_comm_test(sl_comm_request *req, int *done) {
    if (!req) return sl_errorf("sl_comm_test: request is NULL");
    sl_request_impl *impl = req->impl;
    int d = 1, rc = 0;
    if (impl) {
        d = 0;
        rc = impl->test(impl, &d);   // frees impl when done or on failure
        if (rc) d = 1;
    }
    if (d) {
        req->impl = NULL;
        req->done = 1;
    }
    if (done) *done = d;
    return rc;
}
