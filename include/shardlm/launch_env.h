// launch_env.h: who started this process and where it sits in the job. Reads the environment that
// launchers set, in this priority:
//   1. shardlm's own launcher: SHARDLM_RANK, SHARDLM_WORLD_SIZE (both required), SHARDLM_LOCAL_RANK,
//      SHARDLM_LOCAL_WORLD_SIZE, SHARDLM_NODE_RANK, SHARDLM_MASTER_ADDR, SHARDLM_MASTER_PORT
//   2. torchrun: RANK and WORLD_SIZE (both), LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK or NODE_RANK
//   3. Open MPI mpirun: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   4. MPICH / Hydra: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
//   5. SLURM srun: SLURM_PROCID, SLURM_STEP_NUM_TASKS or SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
//      SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE ("2(x3),1") / SLURM_NTASKS_PER_NODE,
//      first host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST as the master address
//   6. none of these: a single process (rank 0 of 1)
// MASTER_ADDR / MASTER_PORT override the master address and port for every launcher except our own
// (whose SHARDLM_MASTER_* come first); defaults are 127.0.0.1 and 29500 (torchrun's).
// Launchers that export no node index (Open MPI, MPICH) get node_rank = rank / local_world_size,
// exact for the default by-slot mapping with the same number of processes on every node.
#ifndef SHARDLM_LAUNCH_ENV_H
#define SHARDLM_LAUNCH_ENV_H

#include <stddef.h>

typedef enum {
    SL_LAUNCHER_NONE = 0,
    SL_LAUNCHER_SHARDLM,
    SL_LAUNCHER_TORCHRUN,
    SL_LAUNCHER_OPENMPI,
    SL_LAUNCHER_MPICH,
    SL_LAUNCHER_SLURM,
} sl_launcher;

typedef struct {
    sl_launcher launcher;
    int rank, world_size;               // global
    int local_rank, local_world_size;   // on this node
    int node_rank;                      // index of this node
    char master_addr[256];
    int master_port;
} sl_launch_env;

// Fills *env from the environment. Returns -1 with a message naming the variable when a value is
// malformed (not a non-negative integer, or inconsistent: rank >= world size, local rank >= local
// world size, a required partner variable missing).
int sl_launch_env_detect(sl_launch_env *env);

// "shardlm", "torchrun", "mpirun (Open MPI)", "mpiexec (MPICH)", "srun (SLURM)" or "none".
const char *sl_launcher_name(sl_launcher launcher);

// setenv()s torchrun's names (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK,
// MASTER_ADDR, MASTER_PORT) from *env, so programs the job runs see a torchrun-style environment.
int sl_launch_env_export(const sl_launch_env *env);

// SLURM hostlists ("node[01-04,07],login1"): the number of hosts, and the index-th host name
// (zero-padding kept: "node01"). One bracket group per host name is supported.
int sl_hostlist_count(const char *hostlist, int *count);
int sl_hostlist_nth(const char *hostlist, int index, char *out, size_t cap);

// SLURM tasks-per-node lists ("2(x3),1" = 2,2,2,1): the number of tasks on node `node`.
int sl_slurm_tasks_on_node(const char *spec, int node, int *tasks);

#endif
