// comm_nccl.c: the "nccl" backend: collectives on device memory through NVIDIA NCCL, one GPU per
// process, bootstrapped over MPI. Compiled only with SHARDLM_HAVE_NCCL (the Makefile defines it
// when CUDA's nccl.h and libnccl are present); otherwise this file is empty and comm.c answers
// "built without NCCL".
//
// libnccl and libcudart are loaded at run time (sl_cuda_dlopen: the CUDA library directory found
// at build time, $CUDA_HOME/lib64, then the loader's search path), so linking libshardlm.a never needs
// CUDA, and a binary built with NCCL still runs the self and mpi backends on a machine without it.
//
// Invariants:
// - Every group (world or split) owns an MPI group with the same ranks in the same order (its
//   bootstrap: rank 0's ncclGetUniqueId goes out by MPI broadcast, then ncclCommInitRank; also used
//   for split and barrier), an NCCL communicator, a CUDA stream and a reusable event. The device is
//   the process's local rank (launch_env) modulo the visible devices, the same for every group.
// - Setup steps that can fail on one rank only (device selection, stream creation, the unique id) are
//   agreed on over MPI before anyone enters an NCCL call, so a failure is an error on every rank,
//   not a hang.
// - The stream is an ordinary (blocking) CUDA stream: it starts after work already queued on the
//   legacy default stream, and default-stream work queued later waits for it. Work on the caller's
//   own non-blocking streams (the CUDA ops backend's) is ordered by sl_comm_order_after: the group's
//   `order_ev` is recorded on that stream and the group's stream waits for it (cudaStreamWaitEvent),
//   so the host never blocks for it.
// - A call whose buffers are host memory (cudaPointerGetAttributes: not device or managed memory)
//   goes over the group's MPI communicator instead of NCCL, blocking or not (the MPI request becomes
//   the call's request). Those are the small control messages (losses, norms, flags, checkpoint
//   status) that callers keep on the host; staging them through the GPU would only add copies. A
//   call mixing host and device buffers is an error. All ranks run the same code, so they agree on
//   the path; a rank passing host memory where another passes device memory would hang, as any
//   mismatched collective does.
// - Blocking calls enqueue on the stream, record the group's event and wait for it; non-blocking
//   calls record a new event owned by the request (test = cudaEventQuery). While waiting, the
//   communicator is polled for asynchronous errors (a failed peer): on one it is aborted (the only
//   way to stop a hung NCCL kernel), the call returns -1, and the group fails every later call.
// - Every CUDA and NCCL call is checked; messages name the call, the group and the rank:
//   "ncclAllReduce on group dp (rank 1 of 2) failed: unhandled cuda error: <NCCL's last error>".
// - Variable-count forms: allgatherv is one ncclBroadcast per non-empty block (root = its owner,
//   into recv + displs[r]; the owner's send is the source, in place when it is that block),
//   reduce_scatterv one ncclReduce per non-empty block, each inside ncclGroupStart/ncclGroupEnd.
//   NCCL takes counts by value, so nothing is kept after the call.
// - send/recv ignore the tag (NCCL has none; messages between two ranks arrive in order) and recv
//   cannot detect a count mismatch (NCCL does not report one).
#ifdef SHARDLM_HAVE_NCCL

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_internal.h"
#include "shardlm/cuda_dlopen.h"
#include "shardlm/error.h"
#include "shardlm/launch_env.h"


// ---- the libraries, loaded at run time -------------------------------------------------------------

#define CUDA_FUNCS(X)                                                                                  \
    X(cudaGetDeviceCount) X(cudaSetDevice) X(cudaGetErrorString) X(cudaStreamCreate) X(cudaStreamDestroy) \
    X(cudaStreamSynchronize) X(cudaEventCreateWithFlags) X(cudaEventDestroy) X(cudaEventRecord) X(cudaEventQuery) \
    X(cudaStreamWaitEvent) X(cudaPointerGetAttributes) X(cudaGetLastError)
#define NCCL_FUNCS(X)                                                                                  \
    X(ncclGetUniqueId) X(ncclCommInitRank) X(ncclCommDestroy) X(ncclCommAbort) X(ncclCommGetAsyncError)   \
    X(ncclGetErrorString) X(ncclGetLastError) X(ncclAllReduce) X(ncclReduceScatter) X(ncclAllGather)      \
    X(ncclBroadcast) X(ncclReduce) X(ncclSend) X(ncclRecv) X(ncclGroupStart) X(ncclGroupEnd)

#define DECLARE_FN(f) __typeof__(&f) f;
static struct {
    int loaded;
    void *cudart, *nccl;
    CUDA_FUNCS(DECLARE_FN)
    NCCL_FUNCS(DECLARE_FN)
} L;

static void *open_lib(const char *name, char *err, size_t cap) {
    const char *names[2] = {name, NULL};
    return sl_cuda_dlopen(names, err, cap);
}

static int load_libs(void) {
    if (L.loaded) return 0;
    char err[1024] = "", cudart_name[64], nccl_name[64];
    snprintf(cudart_name, sizeof cudart_name, "libcudart.so.%d", CUDART_VERSION / 1000);
    snprintf(nccl_name, sizeof nccl_name, "libnccl.so.%d", NCCL_MAJOR);
    if (!L.cudart) L.cudart = open_lib(cudart_name, err, sizeof err);
    if (!L.cudart) return sl_errorf("comm backend nccl: cannot load the CUDA runtime %s: %s", cudart_name, err);
    if (!L.nccl) L.nccl = open_lib(nccl_name, err, sizeof err);
    if (!L.nccl) return sl_errorf("comm backend nccl: cannot load NCCL %s: %s", nccl_name, err);
#define LOAD_FN(lib, f)                                                                                  \
    if (!(L.f = (__typeof__(L.f))dlsym(L.lib, #f)))                                                      \
        return sl_errorf("comm backend nccl: %s has no symbol %s (built against %s; a different version is "  \
                         "installed?)",                                                                  \
                         lib##_name, #f, lib##_name);
#define LOAD_CUDA(f) LOAD_FN(cudart, f)
#define LOAD_NCCL(f) LOAD_FN(nccl, f)
    CUDA_FUNCS(LOAD_CUDA)
    NCCL_FUNCS(LOAD_NCCL)
#undef LOAD_CUDA
#undef LOAD_NCCL
#undef LOAD_FN
    L.loaded = 1;
    return 0;
}

// ---- errors ----------------------------------------------------------------------------------------

typedef struct {
    const char *group;
    int rank, size;
} where;

static where at(const sl_comm *c) { return (where){c->name, c->rank, c->size}; }

static int cuda_check(where w, const char *call, cudaError_t rc) {
    if (rc == cudaSuccess) return 0;
    return sl_errorf("%s on group %s (rank %d of %d) failed: %s (CUDA error %d)", call, w.group, w.rank, w.size,
                     L.cudaGetErrorString(rc), (int)rc);
}

static int nccl_check(where w, const char *call, ncclResult_t rc) {
    if (rc == ncclSuccess) return 0;
    const char *last = L.ncclGetLastError(NULL);   // comm is unused by NCCL: the thread's last error
    return sl_errorf("%s on group %s (rank %d of %d) failed: %s%s%s", call, w.group, w.rank, w.size,
                     L.ncclGetErrorString(rc), last && last[0] ? ": " : "", last ? last : "");
}

static ncclDataType_t nccl_type(sl_dtype dtype) {
    switch (dtype) {
    case SL_DTYPE_F32: return ncclFloat32;
    case SL_DTYPE_F64: return ncclFloat64;
    case SL_DTYPE_I32: return ncclInt32;
    case SL_DTYPE_I64: return ncclInt64;
    case SL_DTYPE_U8: return ncclUint8;
    }
    return ncclFloat32;   // unreachable: comm.c validated dtype
}

static ncclRedOp_t nccl_op(sl_reduce_op op) {
    switch (op) {
    case SL_OP_SUM: return ncclSum;
    case SL_OP_MAX: return ncclMax;
    case SL_OP_MIN: return ncclMin;
    }
    return ncclSum;
}

// ---- groups ----------------------------------------------------------------------------------------

typedef struct {
    sl_comm *mpi;         // the same ranks as an MPI group (bootstrap, split, barrier)
    ncclComm_t nccl;      // NULL before setup and after an abort
    cudaStream_t stream;
    cudaEvent_t sync_ev;  // recorded by blocking calls
    cudaEvent_t order_ev; // recorded on a caller's stream by sl_comm_order_after
    int device;
    int aborted;
} nccl_group;

static void group_release(nccl_group *g) {
    if (!g) return;
    if (L.loaded) {
        L.cudaSetDevice(g->device);
        if (g->nccl) {
            if (g->stream) L.cudaStreamSynchronize(g->stream);
            L.ncclCommDestroy(g->nccl);
        }
        if (g->sync_ev) L.cudaEventDestroy(g->sync_ev);
        if (g->order_ev) L.cudaEventDestroy(g->order_ev);
        if (g->stream) L.cudaStreamDestroy(g->stream);
    }
    sl_comm_free(g->mpi);   // the last MPI group freed after the world finalises MPI (comm_mpi.c)
    free(g);
}

static void nccl_free(sl_comm *c) {
    group_release(c->impl);
    c->impl = NULL;
}

// All ranks of g->mpi agree whether a setup step succeeded everywhere. Returns 0 when it did; else
// -1 with this rank's own error, or one saying another rank failed.
static int agree(sl_comm *c, nccl_group *g, int ok, const char *step) {
    char mine[2048] = "";
    if (!ok) snprintf(mine, sizeof mine, "%s", sl_error());
    int32_t all = ok ? 1 : 0;
    if (sl_comm_allreduce(g->mpi, &all, 1, SL_DTYPE_I32, SL_OP_MIN)) return -1;
    if (all) return 0;
    if (!ok) return sl_errorf("%s", mine);
    return sl_errorf("comm backend nccl on group %s (rank %d of %d): another rank failed %s", c->name, c->rank, c->size,
                     step);
}

// Creates the stream, the event and the NCCL communicator of c (c->rank/size and g->mpi, g->device
// set). Collective over g->mpi. On failure the caller releases g.
static int group_setup(sl_comm *c, nccl_group *g) {
    where w = at(c);
    int ok = cuda_check(w, "cudaSetDevice", L.cudaSetDevice(g->device)) == 0 &&
             cuda_check(w, "cudaStreamCreate", L.cudaStreamCreate(&g->stream)) == 0 &&
             cuda_check(w, "cudaEventCreateWithFlags",
                        L.cudaEventCreateWithFlags(&g->sync_ev, cudaEventDisableTiming)) == 0 &&
             cuda_check(w, "cudaEventCreateWithFlags",
                        L.cudaEventCreateWithFlags(&g->order_ev, cudaEventDisableTiming)) == 0;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (ok && c->rank == 0) ok = nccl_check(w, "ncclGetUniqueId", L.ncclGetUniqueId(&id)) == 0;
    if (agree(c, g, ok, "to create its CUDA stream or the NCCL unique id")) return -1;
    if (sl_comm_broadcast(g->mpi, &id, sizeof id, SL_DTYPE_U8, 0)) return -1;
    ncclComm_t comm = NULL;
    if (nccl_check(w, "ncclCommInitRank", L.ncclCommInitRank(&comm, c->size, id, c->rank))) return -1;
    g->nccl = comm;
    return 0;
}

int sl_comm_nccl_init_world(sl_comm *world, int *argc, char ***argv) {
    // Everything that can fail without a GPU fails here, before MPI starts.
    if (load_libs()) return -1;
    int ndev = 0;
    cudaError_t crc = L.cudaGetDeviceCount(&ndev);
    if (crc != cudaSuccess)
        return sl_errorf("comm backend nccl: cudaGetDeviceCount failed: %s (CUDA error %d): no usable GPU",
                         L.cudaGetErrorString(crc), (int)crc);
    if (ndev < 1) return sl_errorf("comm backend nccl: no CUDA device");
    sl_launch_env env;
    if (sl_launch_env_detect(&env)) return sl_error_context("comm backend nccl: choosing this process's GPU");

    nccl_group *g = sl_calloc(1, sizeof *g, "NCCL group");
    if (!g) return -1;
    sl_comm *mpi = sl_calloc(1, sizeof *mpi, "MPI group");
    if (!mpi) {
        free(g);
        return -1;
    }
    mpi->vt = &sl_comm_mpi_vtable;
    mpi->backend = SL_COMM_MPI;
    mpi->is_world = 1;
    snprintf(mpi->name, sizeof mpi->name, "%s", world->name);
    if (sl_comm_mpi_init_world(mpi, argc, argv)) {
        free(mpi);
        free(g);
        return -1;
    }
    g->mpi = mpi;
    // PyTorch's rule: local rank modulo the visible devices (a launcher that gives each process
    // one GPU through CUDA_VISIBLE_DEVICES leaves one device, 0). Two processes on one GPU are an
    // error from ncclCommInitRank ("Duplicate GPU detected").
    g->device = env.local_rank % ndev;
    world->rank = mpi->rank;
    world->size = mpi->size;
    world->impl = g;
    if (group_setup(world, g)) {
        nccl_free(world);
        return -1;
    }
    return 0;
}

static int nccl_split(sl_comm *parent, int color, int key, sl_comm *child, int *member) {
    nccl_group *pg = parent->impl;
    nccl_group *g = sl_calloc(1, sizeof *g, "NCCL group");
    if (!g) return -1;
    sl_comm *inner = NULL;
    if (sl_comm_split(pg->mpi, color, key, child->name, &inner)) {
        free(g);
        return -1;
    }
    if (!inner) {
        free(g);
        *member = 0;
        return 0;
    }
    *member = 1;
    g->mpi = inner;
    g->device = pg->device;
    child->rank = inner->rank;
    child->size = inner->size;
    child->impl = g;
    if (group_setup(child, g)) {
        nccl_free(child);
        return -1;
    }
    return 0;
}

// ---- waiting ---------------------------------------------------------------------------------------

static void pause_briefly(long spin) {
    if (spin < 1000) return;   // spin first: most waits are short
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

// Waits for ev, watching the communicator for asynchronous errors; on one, aborts it.
static int wait_event(where w, nccl_group *g, cudaEvent_t ev, const char *what) {
    for (long spin = 0;; spin++) {
        if (!g->nccl)
            return sl_errorf("%s on group %s (rank %d of %d): the NCCL communicator was aborted after an earlier error",
                             what, w.group, w.rank, w.size);
        cudaError_t q = L.cudaEventQuery(ev);
        if (q == cudaSuccess) return 0;
        if (q != cudaErrorNotReady) return cuda_check(w, "cudaEventQuery", q);
        ncclResult_t async = ncclSuccess;
        if (nccl_check(w, "ncclCommGetAsyncError", L.ncclCommGetAsyncError(g->nccl, &async))) return -1;
        if (async != ncclSuccess) {
            nccl_check(w, what, async);
            char msg[2048];
            snprintf(msg, sizeof msg, "%s", sl_error());
            L.ncclCommAbort(g->nccl);
            g->nccl = NULL;
            g->aborted = 1;
            return sl_errorf("%s (communicator aborted)", msg);
        }
        pause_briefly(spin);
    }
}

typedef struct {
    sl_request_impl base;
    nccl_group *g;
    cudaEvent_t ev;
    char what[32], group[SL_COMM_NAME_MAX];
    int rank, size;
} nccl_request;

static where req_where(const nccl_request *r) { return (where){r->group, r->rank, r->size}; }

static void request_free(nccl_request *r) {
    if (r->ev) L.cudaEventDestroy(r->ev);   // allowed while pending: released once it completes
    free(r);
}

static int request_wait(sl_request_impl *base) {
    nccl_request *r = (nccl_request *)base;
    int rc = wait_event(req_where(r), r->g, r->ev, r->what);
    request_free(r);
    return rc;
}

static int request_test(sl_request_impl *base, int *done) {
    nccl_request *r = (nccl_request *)base;
    where w = req_where(r);
    *done = 1;
    if (!r->g->nccl) {
        sl_errorf("%s on group %s (rank %d of %d): the NCCL communicator was aborted after an earlier error", r->what,
                  w.group, w.rank, w.size);
        request_free(r);
        return -1;
    }
    cudaError_t q = L.cudaEventQuery(r->ev);
    if (q == cudaErrorNotReady) {
        ncclResult_t async = ncclSuccess;
        ncclResult_t rc = L.ncclCommGetAsyncError(r->g->nccl, &async);
        if (rc == ncclSuccess && async == ncclSuccess) {
            *done = 0;
            return 0;
        }
        return request_wait(base);   // reports (and aborts on) the error, frees r
    }
    int rc = cuda_check(w, "cudaEventQuery", q);
    request_free(r);
    return rc;
}

// Checks that the group is usable and selects its device before enqueueing.
static int begin(sl_comm *c, const char *what) {
    nccl_group *g = c->impl;
    if (!g->nccl)
        return sl_errorf("%s on group %s (rank %d of %d): the NCCL communicator was aborted after an earlier error",
                         what, c->name, c->rank, c->size);
    return cuda_check(at(c), "cudaSetDevice", L.cudaSetDevice(g->device));
}

// After enqueueing: blocking (impl == NULL) waits for the stream's work so far; non-blocking
// records an event into a new request. If no request can be made, waits instead, so that no
// operation is left running on buffers the caller believes free.
static int finish(sl_comm *c, const char *what, sl_request_impl **impl) {
    nccl_group *g = c->impl;
    where w = at(c);
    if (!impl) {
        if (cuda_check(w, "cudaEventRecord", L.cudaEventRecord(g->sync_ev, g->stream))) return -1;
        return wait_event(w, g, g->sync_ev, what);
    }
    *impl = NULL;
    nccl_request *r = sl_calloc(1, sizeof *r, "NCCL request");
    if (r && cuda_check(w, "cudaEventCreateWithFlags", L.cudaEventCreateWithFlags(&r->ev, cudaEventDisableTiming)) == 0 &&
        cuda_check(w, "cudaEventRecord", L.cudaEventRecord(r->ev, g->stream)) == 0) {
        r->base.wait = request_wait;
        r->base.test = request_test;
        r->g = g;
        snprintf(r->what, sizeof r->what, "%s", what);
        snprintf(r->group, sizeof r->group, "%s", c->name);
        r->rank = c->rank;
        r->size = c->size;
        *impl = &r->base;
        return 0;
    }
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", sl_error());
    if (r) request_free(r);
    L.cudaStreamSynchronize(g->stream);
    return sl_errorf("%s", msg);
}

// ---- collectives -----------------------------------------------------------------------------------

#define G(c) ((nccl_group *)(c)->impl)

static int do_allreduce(sl_comm *c, void *buf, size_t count, sl_dtype dtype, sl_reduce_op op, sl_request_impl **impl) {
    if (begin(c, "ncclAllReduce") ||
        nccl_check(at(c), "ncclAllReduce",
                   L.ncclAllReduce(buf, buf, count, nccl_type(dtype), nccl_op(op), G(c)->nccl, G(c)->stream)))
        return -1;
    return finish(c, "ncclAllReduce", impl);
}

// In place when recv == send + rank * recv_count: NCCL's own in-place form.
static int do_reduce_scatter(sl_comm *c, const void *send, void *recv, size_t recv_count, sl_dtype dtype,
                             sl_reduce_op op, sl_request_impl **impl) {
    if (begin(c, "ncclReduceScatter") ||
        nccl_check(at(c), "ncclReduceScatter",
                   L.ncclReduceScatter(send, recv, recv_count, nccl_type(dtype), nccl_op(op), G(c)->nccl, G(c)->stream)))
        return -1;
    return finish(c, "ncclReduceScatter", impl);
}

// In place when send == recv + rank * send_count: NCCL's own in-place form.
static int do_allgather(sl_comm *c, const void *send, void *recv, size_t send_count, sl_dtype dtype,
                        sl_request_impl **impl) {
    if (begin(c, "ncclAllGather") ||
        nccl_check(at(c), "ncclAllGather",
                   L.ncclAllGather(send, recv, send_count, nccl_type(dtype), G(c)->nccl, G(c)->stream)))
        return -1;
    return finish(c, "ncclAllGather", impl);
}

static int do_broadcast(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int root, sl_request_impl **impl) {
    if (begin(c, "ncclBroadcast") ||
        nccl_check(at(c), "ncclBroadcast",
                   L.ncclBroadcast(buf, buf, count, nccl_type(dtype), root, G(c)->nccl, G(c)->stream)))
        return -1;
    return finish(c, "ncclBroadcast", impl);
}

// Ends an NCCL group after a failed call inside it (the group must be closed either way).
static int group_abandon(sl_comm *c, const char *call, ncclResult_t rc) {
    char msg[2048];
    nccl_check(at(c), call, rc);
    snprintf(msg, sizeof msg, "%s", sl_error());
    L.ncclGroupEnd();
    return sl_errorf("%s", msg);
}

static int do_allgatherv(sl_comm *c, const void *send, void *recv, const size_t *counts, const size_t *displs,
                         sl_dtype dtype, sl_request_impl **impl) {
    size_t es = sl_dtype_size(dtype);
    if (begin(c, "ncclBroadcast (allgatherv)") || nccl_check(at(c), "ncclGroupStart", L.ncclGroupStart())) return -1;
    for (int r = 0; r < c->size; r++) {
        if (!counts[r]) continue;
        char *dst = (char *)recv + displs[r] * es;
        const void *src = r == c->rank ? send : dst;   // the source counts only on the root
        ncclResult_t rc = L.ncclBroadcast(src, dst, counts[r], nccl_type(dtype), r, G(c)->nccl, G(c)->stream);
        if (rc != ncclSuccess) return group_abandon(c, "ncclBroadcast (allgatherv)", rc);
    }
    if (nccl_check(at(c), "ncclGroupEnd (allgatherv)", L.ncclGroupEnd())) return -1;
    return finish(c, "allgatherv", impl);
}

static int do_reduce_scatterv(sl_comm *c, const void *send, void *recv, const size_t *counts, sl_dtype dtype,
                              sl_reduce_op op, sl_request_impl **impl) {
    size_t es = sl_dtype_size(dtype), off = 0;
    if (begin(c, "ncclReduce (reduce_scatterv)") || nccl_check(at(c), "ncclGroupStart", L.ncclGroupStart())) return -1;
    for (int r = 0; r < c->size; r++) {
        if (!counts[r]) continue;
        const char *src = (const char *)send + off * es;
        off += counts[r];
        // recv is used only on the root r (where it holds counts[r] > 0 elements).
        ncclResult_t rc =
            L.ncclReduce(src, recv, counts[r], nccl_type(dtype), nccl_op(op), r, G(c)->nccl, G(c)->stream);
        if (rc != ncclSuccess) return group_abandon(c, "ncclReduce (reduce_scatterv)", rc);
    }
    if (nccl_check(at(c), "ncclGroupEnd (reduce_scatterv)", L.ncclGroupEnd())) return -1;
    return finish(c, "reduce_scatterv", impl);
}

// ---- host memory: over the group's MPI communicator --------------------------------------------------

// 1 when p is host memory (pageable or pinned), 0 for device or managed memory, -1 for NULL (a
// zero-count side says nothing). CUDA before 11 fails the query for unregistered host memory: that
// error is cleared and counts as host.
static int is_host(const void *p) {
    if (!p) return -1;
    struct cudaPointerAttributes a;
    memset(&a, 0, sizeof a);
    if (L.cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        L.cudaGetLastError();
        return 1;
    }
    return a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged;
}

// Which path a call takes: 1 MPI (host buffers), 0 NCCL (device buffers), -1 with a message when
// its two buffers (b may be NULL) are of different kinds.
static int host_path(const sl_comm *c, const char *what, const void *a, const void *b) {
    int ha = is_host(a), hb = is_host(b);
    if (ha >= 0 && hb >= 0 && ha != hb)
        return sl_errorf("%s on group %s (rank %d of %d): one buffer is host memory, the other device memory; the "
                         "nccl backend moves device buffers with NCCL and host buffers with MPI, never both in one "
                         "call", what, c->name, c->rank, c->size);
    return ha > 0 || hb > 0;
}

// A non-blocking MPI operation started on the group's MPI communicator becomes this call's request.
static int mpi_started(int rc, sl_comm_request *req, sl_request_impl **impl) {
    *impl = rc ? NULL : req->impl;
    return rc;
}

// ---- vtable entries --------------------------------------------------------------------------------

static int nccl_allreduce(sl_comm *c, void *buf, size_t count, sl_dtype dtype, sl_reduce_op op) {
    int host = host_path(c, "allreduce", buf, NULL);
    if (host) return host < 0 ? -1 : sl_comm_allreduce(G(c)->mpi, buf, count, dtype, op);
    return do_allreduce(c, buf, count, dtype, op, NULL);
}

static int nccl_reduce_scatter(sl_comm *c, const void *send, void *recv, size_t recv_count, sl_dtype dtype,
                               sl_reduce_op op) {
    int host = host_path(c, "reduce_scatter", send, recv);
    if (host) return host < 0 ? -1 : sl_comm_reduce_scatter(G(c)->mpi, send, recv, recv_count, dtype, op);
    return do_reduce_scatter(c, send, recv, recv_count, dtype, op, NULL);
}

static int nccl_allgather(sl_comm *c, const void *send, void *recv, size_t send_count, sl_dtype dtype) {
    int host = host_path(c, "allgather", send, recv);
    if (host) return host < 0 ? -1 : sl_comm_allgather(G(c)->mpi, send, recv, send_count, dtype);
    return do_allgather(c, send, recv, send_count, dtype, NULL);
}

static int nccl_broadcast(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int root) {
    int host = host_path(c, "broadcast", buf, NULL);
    if (host) return host < 0 ? -1 : sl_comm_broadcast(G(c)->mpi, buf, count, dtype, root);
    return do_broadcast(c, buf, count, dtype, root, NULL);
}

// Drains this group's stream (so earlier operations have finished, and their errors surface), then
// an MPI barrier over the same ranks.
static int nccl_barrier(sl_comm *c) {
    if (begin(c, "barrier") || finish(c, "barrier", NULL)) return -1;
    return sl_comm_barrier(G(c)->mpi);
}

static int nccl_send(sl_comm *c, const void *buf, size_t count, sl_dtype dtype, int peer, int tag) {
    int host = host_path(c, "send", buf, NULL);
    if (host) return host < 0 ? -1 : sl_comm_send(G(c)->mpi, buf, count, dtype, peer, tag);
    if (begin(c, "ncclSend") ||
        nccl_check(at(c), "ncclSend", L.ncclSend(buf, count, nccl_type(dtype), peer, G(c)->nccl, G(c)->stream)))
        return -1;
    return finish(c, "ncclSend", NULL);
}

static int nccl_recv(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int peer, int tag) {
    int host = host_path(c, "recv", buf, NULL);
    if (host) return host < 0 ? -1 : sl_comm_recv(G(c)->mpi, buf, count, dtype, peer, tag);
    if (begin(c, "ncclRecv") ||
        nccl_check(at(c), "ncclRecv", L.ncclRecv(buf, count, nccl_type(dtype), peer, G(c)->nccl, G(c)->stream)))
        return -1;
    return finish(c, "ncclRecv", NULL);
}

static int nccl_iallreduce(sl_comm *c, void *buf, size_t count, sl_dtype dtype, sl_reduce_op op,
                           sl_request_impl **impl) {
    sl_comm_request req;
    int host = host_path(c, "iallreduce", buf, NULL);
    if (host < 0) return -1;
    if (host) return mpi_started(sl_comm_iallreduce(G(c)->mpi, buf, count, dtype, op, &req), &req, impl);
    return do_allreduce(c, buf, count, dtype, op, impl);
}

static int nccl_ireduce_scatter(sl_comm *c, const void *send, void *recv, size_t recv_count, sl_dtype dtype,
                                sl_reduce_op op, sl_request_impl **impl) {
    sl_comm_request req;
    int host = host_path(c, "ireduce_scatter", send, recv);
    if (host < 0) return -1;
    if (host)
        return mpi_started(sl_comm_ireduce_scatter(G(c)->mpi, send, recv, recv_count, dtype, op, &req), &req, impl);
    return do_reduce_scatter(c, send, recv, recv_count, dtype, op, impl);
}

static int nccl_iallgather(sl_comm *c, const void *send, void *recv, size_t send_count, sl_dtype dtype,
                           sl_request_impl **impl) {
    sl_comm_request req;
    int host = host_path(c, "iallgather", send, recv);
    if (host < 0) return -1;
    if (host) return mpi_started(sl_comm_iallgather(G(c)->mpi, send, recv, send_count, dtype, &req), &req, impl);
    return do_allgather(c, send, recv, send_count, dtype, impl);
}

static int nccl_ibroadcast(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int root, sl_request_impl **impl) {
    sl_comm_request req;
    int host = host_path(c, "ibroadcast", buf, NULL);
    if (host < 0) return -1;
    if (host) return mpi_started(sl_comm_ibroadcast(G(c)->mpi, buf, count, dtype, root, &req), &req, impl);
    return do_broadcast(c, buf, count, dtype, root, impl);
}

static int nccl_allgatherv(sl_comm *c, const void *send, void *recv, const size_t *counts, const size_t *displs,
                           sl_dtype dtype, sl_request_impl **impl) {
    sl_comm_request req;
    int host = host_path(c, "allgatherv", send, recv);
    if (host < 0) return -1;
    if (host && !impl) return sl_comm_allgatherv(G(c)->mpi, send, recv, counts, displs, dtype);
    if (host) return mpi_started(sl_comm_iallgatherv(G(c)->mpi, send, recv, counts, displs, dtype, &req), &req, impl);
    return do_allgatherv(c, send, recv, counts, displs, dtype, impl);
}

static int nccl_reduce_scatterv(sl_comm *c, const void *send, void *recv, const size_t *counts, sl_dtype dtype,
                                sl_reduce_op op, sl_request_impl **impl) {
    sl_comm_request req;
    int host = host_path(c, "reduce_scatterv", send, recv);
    if (host < 0) return -1;
    if (host && !impl) return sl_comm_reduce_scatterv(G(c)->mpi, send, recv, counts, dtype, op);
    if (host) return mpi_started(sl_comm_ireduce_scatterv(G(c)->mpi, send, recv, counts, dtype, op, &req), &req, impl);
    return do_reduce_scatterv(c, send, recv, counts, dtype, op, impl);
}

// The group's stream waits (on the GPU) for the work queued on `stream` so far.
static int nccl_order_after(sl_comm *c, void *stream) {
    nccl_group *g = c->impl;
    where w = at(c);
    if (begin(c, "sl_comm_order_after")) return -1;
    if (cuda_check(w, "cudaEventRecord (sl_comm_order_after)", L.cudaEventRecord(g->order_ev, (cudaStream_t)stream)))
        return -1;
    return cuda_check(w, "cudaStreamWaitEvent (sl_comm_order_after)", L.cudaStreamWaitEvent(g->stream, g->order_ev, 0));
}

const sl_comm_vtable sl_comm_nccl_vtable = {
    .split = nccl_split,
    .free = nccl_free,
    .allreduce = nccl_allreduce,
    .reduce_scatter = nccl_reduce_scatter,
    .allgather = nccl_allgather,
    .broadcast = nccl_broadcast,
    .barrier = nccl_barrier,
    .send = nccl_send,
    .recv = nccl_recv,
    .iallreduce = nccl_iallreduce,
    .ireduce_scatter = nccl_ireduce_scatter,
    .iallgather = nccl_iallgather,
    .ibroadcast = nccl_ibroadcast,
    .allgatherv = nccl_allgatherv,
    .reduce_scatterv = nccl_reduce_scatterv,
    .order_after = nccl_order_after,
};

#else

typedef int sl_comm_nccl_not_built;   // keeps this translation unit non-empty

#endif
