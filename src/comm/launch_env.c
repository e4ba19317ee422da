// launch_env.c: reads the launcher's environment variables (launch_env.h lists them and their
// priority), SLURM hostlists and tasks-per-node lists, and exports a torchrun-style environment.
//
// Invariants: a successful sl_launch_env_detect gives 0 <= rank < world_size,
// 0 <= local_rank < local_world_size <= world_size, 0 <= node_rank, a non-empty master_addr and
// 1 <= master_port <= 65535. An empty variable counts as unset. Nothing here writes the
// environment except sl_launch_env_export.
#include "shardlm/launch_env.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shardlm/error.h"

#define DEFAULT_MASTER_ADDR "127.0.0.1"
#define DEFAULT_MASTER_PORT 29500

const char *sl_launcher_name(sl_launcher launcher) {
    switch (launcher) {
    case SL_LAUNCHER_NONE: return "none";
    case SL_LAUNCHER_SHARDLM: return "shardlm";
    case SL_LAUNCHER_TORCHRUN: return "torchrun";
    case SL_LAUNCHER_OPENMPI: return "mpirun (Open MPI)";
    case SL_LAUNCHER_MPICH: return "mpiexec (MPICH)";
    case SL_LAUNCHER_SLURM: return "srun (SLURM)";
    }
    return "unknown";
}

static const char *env_get(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

// Decimal digits only (no sign, no spaces), at most INT_MAX.
static int parse_count(const char *s, long long *out) {
    if (!s || !*s) return -1;
    long long v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        v = v * 10 + (*p - '0');
        if (v > INT_MAX) return -1;
    }
    *out = v;
    return 0;
}

// *out = the variable's value when set, else `fallback`; *present says which.
static int env_int(const char *name, int fallback, int *out, int *present) {
    const char *v = env_get(name);
    if (present) *present = v != NULL;
    if (!v) {
        *out = fallback;
        return 0;
    }
    long long x;
    if (parse_count(v, &x))
        return sl_errorf("launch environment: %s=\"%s\" is not a non-negative integer", name, v);
    *out = (int)x;
    return 0;
}

// ---- SLURM lists -----------------------------------------------------------------------------------

// Walks a hostlist; counts hosts into *count and, when want >= 0, writes host number `want` to out.
static int hostlist_walk(const char *list, int want, char *out, size_t cap, int *count, int *found) {
    if (!list || !*list) return sl_errorf("hostlist is empty");
    long long total = 0;
    const char *p = list;
    while (*p) {
        const char *prefix = p;
        while (*p && *p != '[' && *p != ',') p++;
        int plen = (int)(p - prefix);
        if (*p != '[') {
            if (plen == 0) return sl_errorf("hostlist \"%s\": empty host name", list);
            if (total == want) {
                if ((size_t)plen + 1 > cap) return sl_errorf("hostlist \"%s\": host name too long", list);
                snprintf(out, cap, "%.*s", plen, prefix);
                *found = 1;
            }
            total++;
        } else {
            const char *ranges = ++p;
            while (*p && *p != ']') p++;
            if (!*p) return sl_errorf("hostlist \"%s\": '[' without ']'", list);
            const char *ranges_end = p++;
            const char *suffix = p;
            while (*p && *p != ',' && *p != '[') p++;
            if (*p == '[') return sl_errorf("hostlist \"%s\": more than one [...] in a host name is not supported", list);
            int slen = (int)(p - suffix);
            const char *q = ranges;
            while (q < ranges_end) {
                const char *d = q;
                long long lo = 0, hi;
                while (q < ranges_end && *q >= '0' && *q <= '9' && lo <= INT_MAX) lo = lo * 10 + (*q++ - '0');
                int width = (int)(q - d);
                if (width == 0 || lo > INT_MAX) return sl_errorf("hostlist \"%s\": bad range in [...]", list);
                hi = lo;
                if (q < ranges_end && *q == '-') {
                    const char *e = ++q;
                    hi = 0;
                    while (q < ranges_end && *q >= '0' && *q <= '9' && hi <= INT_MAX) hi = hi * 10 + (*q++ - '0');
                    if (q == e || hi > INT_MAX || hi < lo) return sl_errorf("hostlist \"%s\": bad range in [...]", list);
                }
                if (q < ranges_end) {
                    if (*q != ',') return sl_errorf("hostlist \"%s\": unexpected '%c' in [...]", list, *q);
                    q++;
                    if (q == ranges_end) return sl_errorf("hostlist \"%s\": empty range in [...]", list);
                }
                if (want >= total && want <= total + (hi - lo)) {
                    int n = snprintf(out, cap, "%.*s%0*lld%.*s", plen, prefix, width, lo + (want - total), slen, suffix);
                    if (n < 0 || (size_t)n >= cap) return sl_errorf("hostlist \"%s\": host name too long", list);
                    *found = 1;
                }
                total += hi - lo + 1;
                if (total > INT_MAX) return sl_errorf("hostlist \"%s\": too many hosts", list);
            }
            if (ranges == ranges_end) return sl_errorf("hostlist \"%s\": empty [...]", list);
        }
        if (*p == ',') {
            p++;
            if (!*p) return sl_errorf("hostlist \"%s\": trailing ','", list);
        }
    }
    *count = (int)total;
    return 0;
}

int sl_hostlist_count(const char *hostlist, int *count) {
    int found = 0;
    return hostlist_walk(hostlist, -1, NULL, 0, count, &found);
}

int sl_hostlist_nth(const char *hostlist, int index, char *out, size_t cap) {
    int count = 0, found = 0;
    if (!out || cap == 0) return sl_errorf("sl_hostlist_nth: no output buffer");
    out[0] = '\0';
    if (hostlist_walk(hostlist, index, out, cap, &count, &found)) return -1;
    if (!found) return sl_errorf("hostlist \"%s\" has %d hosts; host %d does not exist", hostlist, count, index);
    return 0;
}

int sl_slurm_tasks_on_node(const char *spec, int node, int *tasks) {
    if (!spec || !*spec) return sl_errorf("tasks-per-node list is empty");
    long long seen = 0;
    int found = 0;
    const char *p = spec;
    while (*p) {
        long long n = 0, reps = 1;
        const char *d = p;
        while (*p >= '0' && *p <= '9' && n <= INT_MAX) n = n * 10 + (*p++ - '0');
        if (p == d || n > INT_MAX) return sl_errorf("tasks-per-node list \"%s\": expected a number", spec);
        if (p[0] == '(' && p[1] == 'x') {
            p += 2;
            d = p;
            reps = 0;
            while (*p >= '0' && *p <= '9' && reps <= INT_MAX) reps = reps * 10 + (*p++ - '0');
            if (p == d || reps == 0 || reps > INT_MAX || *p != ')')
                return sl_errorf("tasks-per-node list \"%s\": expected N(xM)", spec);
            p++;
        }
        if (node >= seen && node < seen + reps) {   // keep going: the whole list must parse
            *tasks = (int)n;
            found = 1;
        }
        seen += reps;
        if (*p == ',') {
            p++;
            if (!*p) return sl_errorf("tasks-per-node list \"%s\": trailing ','", spec);
        } else if (*p) {
            return sl_errorf("tasks-per-node list \"%s\": unexpected '%c'", spec, *p);
        }
    }
    if (found) return 0;
    return sl_errorf("tasks-per-node list \"%s\" covers %lld nodes; node %d is not among them", spec, seen, node);
}

// ---- detection -------------------------------------------------------------------------------------

// Reads the rank/size pair and the optional local variables of one launcher.
typedef struct {
    sl_launcher launcher;
    const char *rank, *size, *local_rank, *local_size, *node_rank, *node_rank2;
} launcher_vars;

static const launcher_vars launchers[] = {
    {SL_LAUNCHER_SHARDLM, "SHARDLM_RANK", "SHARDLM_WORLD_SIZE", "SHARDLM_LOCAL_RANK", "SHARDLM_LOCAL_WORLD_SIZE",
     "SHARDLM_NODE_RANK", NULL},
    {SL_LAUNCHER_TORCHRUN, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK"},
    {SL_LAUNCHER_OPENMPI, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", NULL, NULL},
    {SL_LAUNCHER_MPICH, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", NULL, NULL},
    {SL_LAUNCHER_SLURM, "SLURM_PROCID", NULL, "SLURM_LOCALID", NULL, "SLURM_NODEID", NULL},
};

static int detect_slurm_sizes(sl_launch_env *env, int *have_local_size) {
    int present = 0;
    if (env_int("SLURM_STEP_NUM_TASKS", 0, &env->world_size, &present)) return -1;
    if (!present && env_int("SLURM_NTASKS", 0, &env->world_size, &present)) return -1;
    if (!present) return sl_errorf("launch environment: SLURM_PROCID is set but neither SLURM_STEP_NUM_TASKS nor SLURM_NTASKS");
    *have_local_size = 0;
    const char *lists[] = {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"};
    for (int i = 0; i < 2; i++) {
        const char *spec = env_get(lists[i]);
        if (!spec) continue;
        if (sl_slurm_tasks_on_node(spec, env->node_rank, &env->local_world_size))
            return sl_error_context("launch environment: %s", lists[i]);
        *have_local_size = 1;
        return 0;
    }
    if (env_int("SLURM_NTASKS_PER_NODE", 0, &env->local_world_size, have_local_size)) return -1;
    return 0;
}

static int detect_master(sl_launch_env *env) {
    const char *addr = NULL, *addr_var = NULL;
    const char *port_var = NULL;
    if (env->launcher == SL_LAUNCHER_SHARDLM && env_get("SHARDLM_MASTER_ADDR")) addr_var = "SHARDLM_MASTER_ADDR";
    else if (env_get("MASTER_ADDR")) addr_var = "MASTER_ADDR";
    if (addr_var) addr = env_get(addr_var);
    if (env->launcher == SL_LAUNCHER_SHARDLM && env_get("SHARDLM_MASTER_PORT")) port_var = "SHARDLM_MASTER_PORT";
    else if (env_get("MASTER_PORT")) port_var = "MASTER_PORT";

    if (addr) {
        if (strlen(addr) >= sizeof env->master_addr)
            return sl_errorf("launch environment: %s is longer than %zu characters", addr_var, sizeof env->master_addr - 1);
        snprintf(env->master_addr, sizeof env->master_addr, "%s", addr);
    } else if (env->launcher == SL_LAUNCHER_SLURM &&
               (env_get("SLURM_STEP_NODELIST") || env_get("SLURM_JOB_NODELIST"))) {
        const char *var = env_get("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
        if (sl_hostlist_nth(env_get(var), 0, env->master_addr, sizeof env->master_addr))
            return sl_error_context("launch environment: %s", var);
    } else {
        snprintf(env->master_addr, sizeof env->master_addr, "%s", DEFAULT_MASTER_ADDR);
    }
    env->master_port = DEFAULT_MASTER_PORT;
    if (port_var) {
        if (env_int(port_var, DEFAULT_MASTER_PORT, &env->master_port, NULL)) return -1;
        if (env->master_port < 1 || env->master_port > 65535)
            return sl_errorf("launch environment: %s=%d is not a TCP port (1..65535)", port_var, env->master_port);
    }
    return 0;
}

static int detect(sl_launch_env *env) {
    memset(env, 0, sizeof *env);
    env->launcher = SL_LAUNCHER_NONE;
    env->world_size = 1;
    env->local_world_size = 1;
    const launcher_vars *lv = NULL;
    for (size_t i = 0; i < sizeof launchers / sizeof launchers[0]; i++) {
        const launcher_vars *l = &launchers[i];
        int has_rank = env_get(l->rank) != NULL, has_size = l->size && env_get(l->size) != NULL;
        // Our own variables are unambiguous: one without the other is a mistake. RANK alone is too
        // common a name to insist on, so torchrun needs both.
        if (l->launcher == SL_LAUNCHER_SHARDLM && has_rank != has_size)
            return sl_errorf("launch environment: %s is set but %s is not", has_rank ? l->rank : l->size,
                             has_rank ? l->size : l->rank);
        if (has_rank && (has_size || !l->size)) {
            lv = l;
            break;
        }
    }
    if (!lv) return detect_master(env);

    env->launcher = lv->launcher;
    int have_local_rank = 0, have_local_size = 0, have_node = 0;
    if (env_int(lv->rank, 0, &env->rank, NULL)) return -1;
    if (lv->node_rank && env_int(lv->node_rank, 0, &env->node_rank, &have_node)) return -1;
    if (!have_node && lv->node_rank2 && env_int(lv->node_rank2, 0, &env->node_rank, &have_node)) return -1;
    if (lv->size) {
        if (env_int(lv->size, 1, &env->world_size, NULL)) return -1;
        if (lv->local_size && env_int(lv->local_size, 0, &env->local_world_size, &have_local_size)) return -1;
    } else if (detect_slurm_sizes(env, &have_local_size)) {
        return -1;
    }
    if (env_int(lv->local_rank, 0, &env->local_rank, &have_local_rank)) return -1;
    const char *size_var = lv->size ? lv->size : "SLURM_NTASKS";
    if (env->world_size < 1) return sl_errorf("launch environment: %s is 0; a job has at least one process", size_var);
    if (env->rank >= env->world_size)
        return sl_errorf("launch environment: %s=%d is not below the world size %s=%d", lv->rank, env->rank, size_var,
                         env->world_size);
    // Missing local information means one node holding the whole job.
    if (!have_local_size) env->local_world_size = env->world_size;
    if (!have_local_rank) env->local_rank = env->rank % env->local_world_size;
    if (env->local_world_size < 1 || env->local_world_size > env->world_size)
        return sl_errorf("launch environment: local world size %d (%s) must be between 1 and the world size %d",
                         env->local_world_size, lv->local_size ? lv->local_size : "SLURM tasks per node",
                         env->world_size);
    if (env->local_rank >= env->local_world_size)
        return sl_errorf("launch environment: %s=%d is not below the local world size %d", lv->local_rank,
                         env->local_rank, env->local_world_size);
    if (!have_node) env->node_rank = env->rank / env->local_world_size;
    return detect_master(env);
}

int sl_launch_env_detect(sl_launch_env *env) {
    if (!env) return sl_errorf("sl_launch_env_detect: env is NULL");
    if (detect(env) == 0) return 0;
    sl_launcher l = env->launcher;
    memset(env, 0, sizeof *env);
    env->launcher = l;
    return -1;
}

int sl_launch_env_export(const sl_launch_env *env) {
    if (!env) return sl_errorf("sl_launch_env_export: env is NULL");
    struct {
        const char *name;
        int value;
    } ints[] = {{"RANK", env->rank},
                {"LOCAL_RANK", env->local_rank},
                {"WORLD_SIZE", env->world_size},
                {"LOCAL_WORLD_SIZE", env->local_world_size},
                {"NODE_RANK", env->node_rank},
                {"MASTER_PORT", env->master_port}};
    char buf[32];
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        snprintf(buf, sizeof buf, "%d", ints[i].value);
        if (setenv(ints[i].name, buf, 1)) return sl_errorf("setenv(%s) failed", ints[i].name);
    }
    if (setenv("MASTER_ADDR", env->master_addr, 1)) return sl_errorf("setenv(MASTER_ADDR) failed");
    return 0;
}
