// launch.h: the parts of `shardlm launch` and what they hand each other.
//   launch.c            the command: flags, the attempts loop (--max-restarts), --dry-run
//   launch_plan.c       the job plan: backend, hosts and slots, world size, rendezvous, from flags,
//                       the environment, SLURM and a hostfile; printing it (--dry-run, --print-sbatch)
//   launch_backends.c   starting a group: fork (wrappers forked here), mpirun, srun
//   launch_worker.c     the worker wrapper around one rank's program (logs, tee, signals, status)
//   launch_status.c     each rank's status file and the report naming the rank that failed first
//   launch_supervise.c  signal forwarding, parent-death signals, heartbeat watching
//   launch_hosts.c      hostfiles and --include / --exclude
#ifndef SHARDLM_CLI_LAUNCH_H
#define SHARDLM_CLI_LAUNCH_H

#include <stddef.h>
#include <stdio.h>

#include "cli/launch_hosts.h"
#include "cli/launch_supervise.h"

#define LAUNCH_PATH_MAX 4096
#define DERIVED_PATH_MAX (LAUNCH_PATH_MAX + 64)  // a directory plus a file name

typedef struct {
    // torchrun
    int nproc_per_node;  // -1: not given
    int nnodes;          // -1: not given
    int node_rank;
    char master_addr[256];
    int master_port;  // -1: not given
    int standalone;
    int max_restarts;
    char log_dir[LAUNCH_PATH_MAX];
    int tee;  // bit 0: stdout, bit 1: stderr
    // DeepSpeed
    int num_gpus, num_nodes;  // -1: not given
    char include[LAUNCH_PATH_MAX], exclude[LAUNCH_PATH_MAX], hostfile[LAUNCH_PATH_MAX];
    // shardlm
    char backend[16];  // auto | fork | mpirun | srun
    int grace_s;
    int hang_timeout_s;  // 0: no hang detection
    int dry_run, print_sbatch;
    char sbatch_time[64], job_name[128];
    int cpus_per_task;
    // hidden worker mode (the wrapper on each mpirun / srun rank)
    int as_worker;
    char status_dir[LAUNCH_PATH_MAX], devices[LAUNCH_PATH_MAX];
    int prog;  // argv index of PROGRAM
} launch_opts;

typedef enum { BACKEND_FORK, BACKEND_MPIRUN, BACKEND_SRUN } backend_kind;
extern const char *const launch_backend_name[];  // "fork", "mpirun", "srun"

typedef struct {
    backend_kind backend;
    sl_host_pool pool;
    int deepspeed_devices;  // export CUDA_VISIBLE_DEVICES (a DeepSpeed resource flag was given)
    int world_size;
    int local_world_size;  // fork: workers on this node
    int nnodes, node_rank;
    char master_addr[256];
    int master_port;
    char self_exe[LAUNCH_PATH_MAX];
    char **prog_argv;  // NULL-terminated: the program and its arguments as workers run them
    int prog_argc;
    char status_dir[LAUNCH_PATH_MAX];
    int status_dir_is_temp;
    char hostname[256];
} launch_plan;

// ---- launch_plan.c ----
// Fills p from the flags, the environment (MASTER_ADDR/PORT, SLURM_*), the hostfile and PATH.
// -1 with sl_error set; launch_plan_free afterwards either way.
int launch_resolve_plan(const launch_opts *o, int argc, char **argv, launch_plan *p);
void launch_plan_free(launch_plan *p);
// The variables every backend exports (the process's own environment is set to these too).
int launch_set_common_env(const launch_opts *o, const launch_plan *p, int attempt);
extern const char *const launch_common_env_names[];
// "0,1@0": each host's selected slots in rank order (the wrapper's --devices).
int launch_devices_spec(const launch_plan *p, char *buf, int cap);
void launch_print_plan(FILE *f, const launch_opts *o, const launch_plan *p);
// A SLURM batch script that runs this job with srun (--print-sbatch).
void launch_print_sbatch(const launch_opts *o, const launch_plan *p);
void launch_print_quoted(FILE *f, const char *s);  // shell-quoted when needed
void launch_print_argv(FILE *f, char **v);

// ---- launch_backends.c ----
typedef struct {
    char **v;  // NULL-terminated
    int n, cap;
    char *owned[64];  // strings this list allocated
    int nowned;
} argv_list;
// The mpirun or srun command line of the plan (its backend), each rank running the worker wrapper.
int launch_build_command(argv_list *l, const launch_opts *o, const launch_plan *p);
void launch_argv_free(argv_list *l);
// Forks one wrapper per local rank and supervises them. Returns the group's exit code.
int launch_run_fork_group(const launch_opts *o, const launch_plan *p, int attempt);
// Runs mpirun / srun (cmd) and supervises it. Returns the group's exit code.
int launch_run_external_group(const launch_opts *o, const launch_plan *p, char **cmd);

// ---- launch_worker.c ----
typedef struct {
    int rank;
    const char *log_dir;     // NULL: the program writes to the inherited stdout/stderr
    int tee;                 // streams also copied to the terminal, prefixed "[rank N] "
    const char *status_dir;  // NULL: no status file
    int grace_s;
    int hang_timeout_s;  // 0: no hang detection (needs status_dir for the heartbeat file)
    int append;  // a restart: append to the log instead of truncating it
    char **argv;
} worker_spec;
// Runs one worker program to completion under supervision; returns its exit code (128+signal
// when a signal ended it, 127 when it could not be started).
int launch_worker_run(const worker_spec *w);
// Worker mode (`launch --as-worker`): one mpirun / srun rank's wrapper.
int launch_as_worker(const launch_opts *o, char **argv);

// ---- launch_status.c ----
typedef struct {
    int found;
    int rank, code, sig, stopped, hung;
    double time, silent_s;
    char host[256];
    char progress[SL_HEARTBEAT_RECORD + 1];  // a hung rank's last heartbeat: "step 12 training"
} worker_status;
// Writes STATUS_DIR/.status_RANK (nothing when status_dir is NULL); hang: the watch that tripped.
void launch_write_status(const char *status_dir, int rank, const char *host, int code, int sig, int stopped,
                         const sl_hang_watch *hang);
// Removes the status and heartbeat files of every rank.
void launch_clear_status(const char *dir, int world);
// The first worker that failed on its own (not stopped by us), else the first that failed at all.
int launch_first_failure(const launch_plan *p, int first_rank, int count, worker_status *out);
void launch_report_failure(const launch_opts *o, const worker_status *s);
const char *launch_signal_name(int sig);

#endif
