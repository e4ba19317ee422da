// comm.h: process groups and collectives on existing engines. Backends: "self" (one process, no
// library), "mpi" (Open MPI, host memory), and later "nccl" (device memory, bootstrapped over MPI).
// Model and engine code talk to a group only through these functions. Every call returns 0, or -1
// with a message naming the operation, the group and the rank (error.h).
//
// Non-blocking forms start an operation and fill a request; sl_comm_wait / sl_comm_test complete
// it. Buffers handed to a non-blocking call must stay untouched until it completes.
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

// Creates the world group. For "mpi" this initialises MPI (MPI_THREAD_FUNNELED) unless the caller
// already did. `backend_name` is "self", "mpi" or "auto" (mpi when launched by mpirun/srun/our
// launcher with a world size > 1, else self).
int sl_comm_init_world(sl_comm **world, const char *backend_name, int *argc, char ***argv);
// Frees a group; freeing the world also finalises the backend.
void sl_comm_free(sl_comm *comm);

int sl_comm_rank(const sl_comm *comm);
int sl_comm_size(const sl_comm *comm);
sl_comm_backend sl_comm_backend_of(const sl_comm *comm);
const char *sl_comm_name(const sl_comm *comm);   // "world", "dp", "tp", "pp", ...

// Sub-group of the members that pass the same color, ordered by key (MPI_Comm_split semantics).
int sl_comm_split(sl_comm *parent, int color, int key, const char *name, sl_comm **out);

// Blocking collectives. Counts are in elements of `dtype`.
int sl_comm_allreduce(sl_comm *c, void *buf, size_t count, sl_dtype dtype, sl_reduce_op op);
// send holds size * recv_count elements; rank r receives the reduction of block r.
int sl_comm_reduce_scatter(sl_comm *c, const void *send, void *recv, size_t recv_count, sl_dtype dtype,
                           sl_reduce_op op);
// recv holds size * send_count elements: block r is rank r's send.
int sl_comm_allgather(sl_comm *c, const void *send, void *recv, size_t send_count, sl_dtype dtype);
int sl_comm_broadcast(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int root);
int sl_comm_barrier(sl_comm *c);
int sl_comm_send(sl_comm *c, const void *buf, size_t count, sl_dtype dtype, int peer, int tag);
int sl_comm_recv(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int peer, int tag);

// Non-blocking forms.
int sl_comm_iallreduce(sl_comm *c, void *buf, size_t count, sl_dtype dtype, sl_reduce_op op, sl_comm_request *req);
int sl_comm_ireduce_scatter(sl_comm *c, const void *send, void *recv, size_t recv_count, sl_dtype dtype,
                            sl_reduce_op op, sl_comm_request *req);
int sl_comm_iallgather(sl_comm *c, const void *send, void *recv, size_t send_count, sl_dtype dtype,
                       sl_comm_request *req);
int sl_comm_ibroadcast(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int root, sl_comm_request *req);
int sl_comm_wait(sl_comm_request *req);
int sl_comm_test(sl_comm_request *req, int *done);

// Bytes this process has passed to collectives/sends on the group since creation (for benchmarks).
size_t sl_comm_bytes_sent(const sl_comm *c);

typedef struct {
    int tp, pp, dp;                       // sizes; tp * pp * dp == world size
    int tp_rank, pp_rank, dp_rank;
    sl_comm *world, *tp_group, *pp_group, *dp_group;
} sl_topology;

// Splits the world into tensor/pipeline/data groups (Megatron order). Errors name the sizes when
// tp * pp does not divide the world size.
int sl_topology_init(sl_topology *t, sl_comm *world, int tp, int pp);
void sl_topology_free(sl_topology *t);

#endif
