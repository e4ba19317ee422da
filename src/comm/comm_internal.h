// comm_internal.h: what comm.c (dispatch, argument checks, byte counting) shares with the backends
// (comm_self.c, comm_mpi.c, comm_nccl.c). Not a public header: only src/comm/ and white-box tests include it.
//
// Invariants:
// - comm.c validates every argument (NULL buffers with a non-zero count, dtype/op range, root and
//   peer range, overlapping buffers) before a backend sees it, so backends trust their arguments.
// - For reduce_scatter, `recv` is either disjoint from `send` or exactly send + rank * recv_count
//   (the in-place form); for allgather, `send` is disjoint from `recv` or exactly
//   recv + rank * send_count. Backends handle both forms.
// - For the variable-count forms (allgatherv, reduce_scatterv), counts[r] and displs[r] are
//   <= INT_MAX, for reduce_scatterv sum(counts) <= INT_MAX too, and at least one count is non-zero;
//   allgatherv's blocks do not overlap and `send` is either disjoint from recv's extent or exactly
//   recv + displs[rank] (in place; or counts[rank] == 0); reduce_scatterv's recv is disjoint from
//   send. Backends must not keep counts/displs past the call (copy them into a request if needed).
// - Backends never count bytes; comm.c adds to bytes_sent after a call succeeds.
// - A request's impl, when not NULL, points at a struct whose first member is sl_request_impl; its
//   wait/test functions complete it and free it (also on failure), after which comm.c sets
//   req->impl = NULL and req->done = 1.
#ifndef SHARDLM_COMM_INTERNAL_H
#define SHARDLM_COMM_INTERNAL_H

#include <stddef.h>

#include "shardlm/comm.h"

typedef struct sl_request_impl sl_request_impl;
struct sl_request_impl {
    // Both return 0 or -1 (with sl_errorf). wait always frees the impl; test frees it once done.
    int (*wait)(sl_request_impl *r);
    int (*test)(sl_request_impl *r, int *done);
};

typedef struct {
    // Fills child->rank, child->size and child->impl; sets *member = 0 when color < 0 (the caller
    // then frees nothing and returns NULL).
    int (*split)(sl_comm *parent, int color, int key, sl_comm *child, int *member);
    void (*free)(sl_comm *c);
    int (*allreduce)(sl_comm *c, void *buf, size_t count, sl_dtype dtype, sl_reduce_op op);
    int (*reduce_scatter)(sl_comm *c, const void *send, void *recv, size_t recv_count, sl_dtype dtype,
                          sl_reduce_op op);
    int (*allgather)(sl_comm *c, const void *send, void *recv, size_t send_count, sl_dtype dtype);
    int (*broadcast)(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int root);
    int (*barrier)(sl_comm *c);
    int (*send)(sl_comm *c, const void *buf, size_t count, sl_dtype dtype, int peer, int tag);
    int (*recv)(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int peer, int tag);
    // Non-blocking forms set *impl to NULL when the operation already completed.
    int (*iallreduce)(sl_comm *c, void *buf, size_t count, sl_dtype dtype, sl_reduce_op op, sl_request_impl **impl);
    int (*ireduce_scatter)(sl_comm *c, const void *send, void *recv, size_t recv_count, sl_dtype dtype,
                           sl_reduce_op op, sl_request_impl **impl);
    int (*iallgather)(sl_comm *c, const void *send, void *recv, size_t send_count, sl_dtype dtype,
                      sl_request_impl **impl);
    int (*ibroadcast)(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int root, sl_request_impl **impl);
    // Variable-count forms; `impl` is NULL for the blocking call, else the non-blocking form's
    // request slot (set to NULL when the operation already completed).
    int (*allgatherv)(sl_comm *c, const void *send, void *recv, const size_t *counts, const size_t *displs,
                      sl_dtype dtype, sl_request_impl **impl);
    int (*reduce_scatterv)(sl_comm *c, const void *send, void *recv, const size_t *counts, sl_dtype dtype,
                           sl_reduce_op op, sl_request_impl **impl);
    // sl_comm_order_after with a non-NULL stream; NULL for backends on host memory (nothing to order).
    int (*order_after)(sl_comm *c, void *stream);
} sl_comm_vtable;

#define SL_COMM_NAME_MAX 32

struct sl_comm {
    const sl_comm_vtable *vt;
    sl_comm_backend backend;
    char name[SL_COMM_NAME_MAX];
    int rank, size;
    int is_world;
    size_t bytes_sent;
    void *impl;   // backend state (MPI: a struct holding the MPI_Comm)
};

// Size in bytes of one element of dtype (0 for an invalid dtype).
size_t sl_dtype_size(sl_dtype dtype);
const char *sl_dtype_name(sl_dtype dtype);
const char *sl_reduce_op_name(sl_reduce_op op);

// Backend constructors for the world group: fill rank, size, impl (vt/backend/name set by comm.c).
int sl_comm_self_init_world(sl_comm *world);
int sl_comm_mpi_init_world(sl_comm *world, int *argc, char ***argv);
extern const sl_comm_vtable sl_comm_self_vtable;
extern const sl_comm_vtable sl_comm_mpi_vtable;
// The NCCL backend (comm_nccl.c) exists only when built with SHARDLM_HAVE_NCCL (the Makefile
// defines it when CUDA's nccl.h and libnccl are present).
int sl_comm_nccl_init_world(sl_comm *world, int *argc, char ***argv);
extern const sl_comm_vtable sl_comm_nccl_vtable;

// Test hook: the largest element count handed to one MPI call (default INT_MAX). Counts above it
// are split into chunks, which lets tests exercise the >INT_MAX path with small buffers. 0 restores
// the default. Returns the previous value.
size_t sl_comm_mpi_set_max_chunk(size_t elements);

#endif
