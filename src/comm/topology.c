// topology.c: splits the world into tensor-, data- and pipeline-parallel groups with Megatron's rank
// order (tensor-parallel innermost, then data, then pipeline):
//   world_rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank
// so the tp group of a rank is tp consecutive world ranks, its dp group is dp ranks tp apart, and its
// pp group is pp ranks dp * tp apart. Within each group, members are ordered by that group's rank.
//
// Invariants: on success all three groups exist (of size tp, dp, pp) and tp * dp * pp equals the
// world size; on failure nothing is left allocated and *t is zeroed.
#include <string.h>

#include "shardlm/comm.h"
#include "shardlm/error.h"

int sl_topology_init(sl_topology *t, sl_comm *world, int tp, int pp) {
    if (!t) return sl_errorf("sl_topology_init: topology is NULL");
    memset(t, 0, sizeof *t);
    if (!world) return sl_errorf("sl_topology_init: world group is NULL");
    int size = sl_comm_size(world), rank = sl_comm_rank(world);
    if (tp < 1 || pp < 1)
        return sl_errorf("topology: tensor-parallel size %d and pipeline-parallel size %d must both be at least 1", tp, pp);
    if ((long long)tp * pp > size || size % (tp * pp) != 0)
        return sl_errorf("topology: tensor-parallel size %d x pipeline-parallel size %d = %lld does not divide the "
                         "world size %d",
                         tp, pp, (long long)tp * pp, size);
    int dp = size / (tp * pp);
    t->tp = tp;
    t->pp = pp;
    t->dp = dp;
    t->tp_rank = rank % tp;
    t->dp_rank = (rank / tp) % dp;
    t->pp_rank = rank / (tp * dp);
    t->world = world;
    // color = the coordinates the group's members share; key = the coordinate that varies.
    if (sl_comm_split(world, t->pp_rank * dp + t->dp_rank, t->tp_rank, "tp", &t->tp_group) ||
        sl_comm_split(world, t->pp_rank * tp + t->tp_rank, t->dp_rank, "dp", &t->dp_group) ||
        sl_comm_split(world, t->dp_rank * tp + t->tp_rank, t->pp_rank, "pp", &t->pp_group)) {
        sl_topology_free(t);
        return sl_error_context("topology tp=%d dp=%d pp=%d", tp, dp, pp);
    }
    return 0;
}

void sl_topology_free(sl_topology *t) {
    if (!t) return;
    sl_comm_free(t->tp_group);
    sl_comm_free(t->dp_group);
    sl_comm_free(t->pp_group);
    memset(t, 0, sizeof *t);
}
