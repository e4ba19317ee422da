// comm_self.c: the "self" backend, a group of one process with no library underneath. Collectives
// over one rank are copies: allreduce and broadcast leave the buffer as it is, reduce_scatter(v) and
// allgather(v) copy the single block (memmove, so the in-place forms work), barrier returns at once.
// Non-blocking forms complete before they return (their request impl is NULL).
//
// Invariants: every group has rank 0 and size 1; comm.c has already rejected send/recv (the only
// peer would be this rank), so those entries only guard against a direct call.
#include <string.h>

#include "comm/comm_internal.h"
#include "shardlm/error.h"

int sl_comm_self_init_world(sl_comm *world) {
    world->rank = 0;
    world->size = 1;
    world->impl = NULL;
    return 0;
}

static int self_split(sl_comm *parent, int color, int key, sl_comm *child, int *member) {
    (void)parent;
    (void)key;
    *member = color >= 0;
    child->rank = 0;
    child->size = 1;
    child->impl = NULL;
    return 0;
}

static void self_free(sl_comm *c) { (void)c; }

static int self_allreduce(sl_comm *c, void *buf, size_t count, sl_dtype dtype, sl_reduce_op op) {
    (void)c, (void)buf, (void)count, (void)dtype, (void)op;
    return 0;
}

static int self_reduce_scatter(sl_comm *c, const void *send, void *recv, size_t recv_count, sl_dtype dtype,
                               sl_reduce_op op) {
    (void)c, (void)op;
    if (send != recv) memmove(recv, send, recv_count * sl_dtype_size(dtype));
    return 0;
}

static int self_allgather(sl_comm *c, const void *send, void *recv, size_t send_count, sl_dtype dtype) {
    (void)c;
    if (send != recv) memmove(recv, send, send_count * sl_dtype_size(dtype));
    return 0;
}

static int self_broadcast(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int root) {
    (void)c, (void)buf, (void)count, (void)dtype, (void)root;
    return 0;
}

static int self_barrier(sl_comm *c) {
    (void)c;
    return 0;
}

static int self_send(sl_comm *c, const void *buf, size_t count, sl_dtype dtype, int peer, int tag) {
    (void)buf, (void)count, (void)dtype, (void)tag;
    return sl_errorf("sl_comm_send on group %s (self backend): peer %d; a one-process group has no one to send to",
                     c->name, peer);
}

static int self_recv(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int peer, int tag) {
    (void)buf, (void)count, (void)dtype, (void)tag;
    return sl_errorf("sl_comm_recv on group %s (self backend): peer %d; a one-process group has no one to receive from",
                     c->name, peer);
}

static int self_iallreduce(sl_comm *c, void *buf, size_t count, sl_dtype dtype, sl_reduce_op op,
                           sl_request_impl **impl) {
    *impl = NULL;
    return self_allreduce(c, buf, count, dtype, op);
}

static int self_ireduce_scatter(sl_comm *c, const void *send, void *recv, size_t recv_count, sl_dtype dtype,
                                sl_reduce_op op, sl_request_impl **impl) {
    *impl = NULL;
    return self_reduce_scatter(c, send, recv, recv_count, dtype, op);
}

static int self_iallgather(sl_comm *c, const void *send, void *recv, size_t send_count, sl_dtype dtype,
                           sl_request_impl **impl) {
    *impl = NULL;
    return self_allgather(c, send, recv, send_count, dtype);
}

static int self_ibroadcast(sl_comm *c, void *buf, size_t count, sl_dtype dtype, int root, sl_request_impl **impl) {
    *impl = NULL;
    return self_broadcast(c, buf, count, dtype, root);
}

static int self_allgatherv(sl_comm *c, const void *send, void *recv, const size_t *counts, const size_t *displs,
                           sl_dtype dtype, sl_request_impl **impl) {
    (void)c;
    if (impl) *impl = NULL;
    size_t es = sl_dtype_size(dtype);
    char *dst = (char *)recv + displs[0] * es;
    if (counts[0] && (const void *)dst != send) memmove(dst, send, counts[0] * es);
    return 0;
}

static int self_reduce_scatterv(sl_comm *c, const void *send, void *recv, const size_t *counts, sl_dtype dtype,
                                sl_reduce_op op, sl_request_impl **impl) {
    (void)c, (void)op;
    if (impl) *impl = NULL;
    if (counts[0]) memmove(recv, send, counts[0] * sl_dtype_size(dtype));
    return 0;
}

const sl_comm_vtable sl_comm_self_vtable = {
    .split = self_split,
    .free = self_free,
    .allreduce = self_allreduce,
    .reduce_scatter = self_reduce_scatter,
    .allgather = self_allgather,
    .broadcast = self_broadcast,
    .barrier = self_barrier,
    .send = self_send,
    .recv = self_recv,
    .iallreduce = self_iallreduce,
    .ireduce_scatter = self_ireduce_scatter,
    .iallgather = self_iallgather,
    .ibroadcast = self_ibroadcast,
    .allgatherv = self_allgatherv,
    .reduce_scatterv = self_reduce_scatterv,
};
