// comm.h: process groups and collectives on existing engines. Backends: "self" (one process, no
// library), "mpi" (Open MPI, host memory), and "nccl" (NVIDIA NCCL, device memory, one GPU per
// process: local rank modulo the visible devices; bootstrapped over MPI; present only when built
// with CUDA's NCCL, else sl_comm_init_world says "built without NCCL"). With "nccl" a call's buffers
// are device memory (cudaMalloc) of this process's GPU, moved by NCCL on the group's own CUDA
// stream, or all host memory (the small control messages: a loss, a norm, a flag, a checkpoint's
// status), which go over the group's MPI communicator instead; every rank must pass the same kind of
// memory to one call, and one call may not mix the two. The stream is ordered after work already
// queued on the legacy default stream; work on other streams (the ops backend's) must be ordered
// first with sl_comm_order_after. Blocking calls return when the operation has finished on the GPU;
// send/recv ignore the tag and cannot detect a count mismatch.
// Model and engine code talk to a group only through these functions. Every call returns 0, or -1
// with a message naming the operation, the group and the rank (error.h).
//
// Non-blocking forms start an operation and fill a request; sl_comm_wait / sl_comm_test complete
// it. Buffers handed to a non-blocking call must stay untouched until it completes. Several may be
// outstanding on one group, but every rank must start collectives on a group in the same order
// (MPI's rule). A request that failed to start, or has completed, has impl == NULL and done == 1;
// waiting on it again returns 0. Complete every request of a group before freeing the group.
//
// Element counts are size_t: the MPI backend splits counts above INT_MAX into several calls
// (except in the variable-count forms, limited to INT_MAX: see sl_comm_allgatherv).
// Zero counts are allowed and do nothing. MPI errors come back as -1 (MPI_ERRORS_RETURN), never
// as an abort.
//
// Groups for data, tensor and pipeline parallelism are sub-groups of the world built by
// sl_topology_init, with Megatron's rank order: tensor-parallel innermost, then data, then pipeline:
//   world_rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank
#ifndef SHARDLM_COMM_H
#define SHARDLM_COMM_H

#include <stddef.h>

typedef struct sl_comm sl_comm;

typedef enum { SL_COMM_SELF = 0, SL_COMM_MPI = 1, SL_COMM_NCCL = 2 } sl_comm_backend;
typedef enum { SL_DTYPE_F32 = 0, SL_DTYPE_F64 = 1, SL_DTYPE_I32 = 2, SL_DTYPE_I64 = 3, SL_DTYPE_U8 = 4 } sl_dtype;
typedef enum { SL_OP_SUM = 0, SL_OP_MAX = 1, SL_OP_MIN = 2 } sl_reduce_op;

typedef struct {
    void *impl;   // backend request (e.g. an MPI_Request); NULL when complete
    int done;
} sl_comm_request;

// Creates the world group. For "mpi" and "nccl" this initialises MPI (MPI_THREAD_FUNNELED) unless
// the caller already did. `backend_name` is "self", "mpi", "nccl" or "auto" (mpi when launched by
// mpirun/srun/our launcher with a world size > 1, else self; auto never picks nccl).
int sl_comm_init_world(sl_comm **world, const char *backend_name, int *argc, char ***argv);
// The backend sl_comm_init_world(backend_name) creates, known before any library starts: "auto" is
// mpi when the launch environment (launch_env.h) has a world size > 1, else self. *world_size: 1 for
// self, the launch environment's for the others (0 when it says nothing usable; an MPI world's size
// is only final once MPI is up). -1 for an unknown name or, under auto, a malformed environment.
int sl_comm_choose_backend(const char *backend_name, sl_comm_backend *backend, int *world_size);
// Frees a group; freeing the world also finalises the backend.
void sl_comm_free(sl_comm *comm);

int sl_comm_rank(const sl_comm *comm);
int sl_comm_size(const sl_comm *comm);
sl_comm_backend sl_comm_backend_of(const sl_comm *comm);
// 1 when this library was built with the NCCL backend (CUDA's nccl.h was found), else 0.
int sl_comm_nccl_built(void);
const char *sl_comm_name(const sl_comm *comm);   // "world", "dp", "tp", "pp", ...

// Sub-group of the members that pass the same color, ordered by key (MPI_Comm_split semantics).
// A negative color means "not a member": *out is set to NULL and 0 is returned. Collective over
// the parent. `name` (1..31 characters) appears in error messages.
int sl_comm_split(sl_comm *parent, int color, int key, const char *name, sl_comm **out);

// Blocking collectives. Counts are in elements of `dtype`.
int sl_comm_allreduce(sl_comm *c, void *buf, size_t count, sl_dtype dtype, sl_reduce_op op);
// send holds size * recv_count elements; rank r receives the reduction of block r. In place:
// recv == send + rank * recv_count (only that block of send changes). Pad the input to a multiple
// of size (ZeRO's shards): recv_count is per rank.
int sl_comm_reduce_scatter(sl_comm *c, const void *send, void *recv, size_t recv_count, sl_dtype dtype,
                           sl_reduce_op op);
// recv holds size * send_count elements: block r is rank r's send. In place:
// send == recv + rank * send_count.
int sl_comm_allgather(sl_comm *c, const void *send, void *recv, size_t send_count, sl_dtype dtype);
int sl_comm_broadcast(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int root);
int sl_comm_barrier(sl_comm *c);

// Variable-count forms (uneven shards). counts and displs have one entry per rank of the group,
// must be the same on every rank, and are only read during the call (the caller may free them as
// soon as a non-blocking form returns). Zero counts are allowed (send / recv may then be NULL).
// Limit: unlike the fixed-count forms these are not split into chunks: every count and every
// displacement must be <= INT_MAX elements, and for reduce_scatterv also sum(counts); anything
// larger is an error naming the entry.
//
// allgatherv: counts[r] elements from rank r land at recv + displs[r] (element offsets) on every
// rank; send holds counts[rank] elements. In place: send == recv + displs[rank] (its block is left
// as it is). Blocks may not overlap each other; send must otherwise be disjoint from recv.
int sl_comm_allgatherv(sl_comm *c, const void *send, void *recv, const size_t *counts, const size_t *displs,
                       sl_dtype dtype);
// reduce_scatterv: send holds sum(counts) elements, block r (counts[r] elements) starting at
// sum_{q<r} counts[q]; rank r receives the reduction over ranks of block r in recv (counts[rank]
// elements). recv must not overlap send (no in-place form).
int sl_comm_reduce_scatterv(sl_comm *c, const void *send, void *recv, const size_t *counts, sl_dtype dtype,
                            sl_reduce_op op);
// Point-to-point: peer is another rank of the group (oneself is an error), 0 <= tag <= 32767; recv
// fails if the message holds a different number of elements than count.
int sl_comm_send(sl_comm *c, const void *buf, size_t count, sl_dtype dtype, int peer, int tag);
int sl_comm_recv(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int peer, int tag);

// Non-blocking forms.
int sl_comm_iallreduce(sl_comm *c, void *buf, size_t count, sl_dtype dtype, sl_reduce_op op, sl_comm_request *req);
int sl_comm_ireduce_scatter(sl_comm *c, const void *send, void *recv, size_t recv_count, sl_dtype dtype,
                            sl_reduce_op op, sl_comm_request *req);
int sl_comm_iallgather(sl_comm *c, const void *send, void *recv, size_t send_count, sl_dtype dtype,
                       sl_comm_request *req);
int sl_comm_ibroadcast(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int root, sl_comm_request *req);
int sl_comm_iallgatherv(sl_comm *c, const void *send, void *recv, const size_t *counts, const size_t *displs,
                        sl_dtype dtype, sl_comm_request *req);
int sl_comm_ireduce_scatterv(sl_comm *c, const void *send, void *recv, const size_t *counts, sl_dtype dtype,
                             sl_reduce_op op, sl_comm_request *req);
int sl_comm_wait(sl_comm_request *req);
int sl_comm_test(sl_comm_request *req, int *done);

// Makes the group's later operations start only after the work already queued on `stream` (a
// cudaStream_t as void*, the ops table's stream()), without blocking the host: "nccl" records an
// event on `stream` and makes the group's stream wait for it, so a collective reads gradients only
// once the kernels that write them have run, and writes a buffer only once the kernels that read it
// have. A NULL stream, and the "self" and "mpi" backends (host memory, whose ops have finished when
// they return), do nothing. The other direction needs nothing: once sl_comm_wait (or a blocking call)
// has returned, work queued afterwards on any stream sees the result.
int sl_comm_order_after(sl_comm *c, void *stream);

// Bytes this process has passed to collectives/sends on the group since creation (for benchmarks),
// counted when a call succeeds (at start for non-blocking forms), the same for every backend:
// allreduce count, reduce_scatter size * recv_count (its whole input), allgather send_count,
// allgatherv counts[rank], reduce_scatterv sum(counts) (its whole input), broadcast count on the
// root and 0 elsewhere, send count; recv and barrier add 0; each times the element size.
size_t sl_comm_bytes_sent(const sl_comm *c);

typedef struct {
    int tp, pp, dp;                       // sizes; tp * pp * dp == world size
    int tp_rank, pp_rank, dp_rank;
    sl_comm *world, *tp_group, *pp_group, *dp_group;
} sl_topology;

// Splits the world into tensor/pipeline/data groups (Megatron order); dp = world / (tp * pp). The
// groups are named "tp", "dp", "pp"; t->world is borrowed, not freed by sl_topology_free. Errors
// name the sizes when tp * pp does not divide the world size.
int sl_topology_init(sl_topology *t, sl_comm *world, int tp, int pp);
void sl_topology_free(sl_topology *t);

#endif
