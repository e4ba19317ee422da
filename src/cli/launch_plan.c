// launch_plan.c: the job plan of `shardlm launch`: which backend (srun inside a SLURM allocation,
// else mpirun, else fork; or --backend), which hosts and slots (launch_hosts.c: hostfile, --include /
// --exclude, --num_nodes / --num_gpus), the world size, the rendezvous address and port (flags, then
// MASTER_ADDR / MASTER_PORT, then the hostfile's first host), the program each rank runs, and the
// environment every backend exports. Also prints a plan: --dry-run's lines and --print-sbatch's script.
#include "cli/launch.h"
#include "shardlm/error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *const launch_backend_name[] = {"fork", "mpirun", "srun"};

static const char *const shardlm_commands[] = {"train", "prepare", "generate", "convert", "estimate", "report", "serve", NULL};

static int is_shardlm_command(const char *s) {
    for (int i = 0; shardlm_commands[i]; i++)
        if (!strcmp(s, shardlm_commands[i])) return 1;
    return 0;
}

// True if `name` is an executable file in $PATH.
static int in_path(const char *name) {
    const char *path = getenv("PATH");
    if (!path) return 0;
    char buf[LAUNCH_PATH_MAX];
    while (*path) {
        const char *colon = strchr(path, ':');
        size_t len = colon ? (size_t)(colon - path) : strlen(path);
        if (len > 0 && len + strlen(name) + 2 < sizeof buf) {
            snprintf(buf, sizeof buf, "%.*s/%s", (int)len, path, name);
            if (access(buf, X_OK) == 0) return 1;
        }
        if (!colon) break;
        path = colon + 1;
    }
    return 0;
}

static int plan_program(launch_plan *p, int argc, char **argv, int prog) {
    const char *name = argv[prog];
    if (!strcmp(name, "launch")) return sl_errorf("`shardlm launch launch` makes no sense: give the program to run");
    int sub = is_shardlm_command(name);
    p->prog_argc = argc - prog + (sub ? 1 : 0);
    p->prog_argv = calloc((size_t)p->prog_argc + 1, sizeof(char *));
    if (!p->prog_argv) return sl_errorf("out of memory");
    int k = 0;
    if (sub) p->prog_argv[k++] = p->self_exe;
    for (int i = prog; i < argc; i++) p->prog_argv[k++] = argv[i];
    return 0;
}

int launch_resolve_plan(const launch_opts *o, int argc, char **argv, launch_plan *p) {
    memset(p, 0, sizeof *p);
    gethostname(p->hostname, sizeof p->hostname - 1);
    ssize_t n = readlink("/proc/self/exe", p->self_exe, sizeof p->self_exe - 1);
    if (n <= 0) return sl_errorf("cannot find this program's path (/proc/self/exe): %s", strerror(errno));
    p->self_exe[n] = '\0';
    if (plan_program(p, argc, argv, o->prog) != 0) return -1;

    // backend
    if (!strcmp(o->backend, "fork")) p->backend = BACKEND_FORK;
    else if (!strcmp(o->backend, "mpirun")) p->backend = BACKEND_MPIRUN;
    else if (!strcmp(o->backend, "srun")) p->backend = BACKEND_SRUN;
    else if (getenv("SLURM_JOB_ID") && in_path("srun")) p->backend = BACKEND_SRUN;
    else if (in_path("mpirun")) p->backend = BACKEND_MPIRUN;
    else p->backend = BACKEND_FORK;
    if (o->print_sbatch) p->backend = BACKEND_SRUN;  // the script runs srun inside the allocation
    if (!o->dry_run && !o->print_sbatch) {
        if (p->backend == BACKEND_MPIRUN && !in_path("mpirun")) return sl_errorf("--backend mpirun: mpirun is not in PATH");
        if (p->backend == BACKEND_SRUN && !in_path("srun")) return sl_errorf("--backend srun: srun is not in PATH");
    }

    // resources
    int nproc = o->nproc_per_node > 0 ? o->nproc_per_node : o->num_gpus;
    int nnodes = o->nnodes > 0 ? o->nnodes : o->num_nodes;
    p->deepspeed_devices = o->hostfile[0] || o->include[0] || o->exclude[0] || o->num_gpus > 0;
    if (p->backend == BACKEND_SRUN && (o->hostfile[0] || o->include[0] || o->exclude[0]))
        return sl_errorf("with srun%s the SLURM allocation decides the hosts; --hostfile/--include/--exclude need --backend mpirun",
                         o->print_sbatch ? " (--print-sbatch)" : "");
    if (o->hostfile[0]) {
        if (sl_hostfile_read(o->hostfile, &p->pool) != 0) return -1;
        if (sl_host_pool_limit(&p->pool, nnodes, nproc) != 0) return -1;
    } else {
        int slots = nproc;
        if (slots < 1) {
            int hi = sl_host_spec_max_slot(o->include[0] ? o->include : o->exclude, "localhost");
            slots = hi >= 0 ? hi + 1 : 1;
        }
        if (sl_host_pool_add(&p->pool, "localhost", slots) != 0) return -1;
    }
    if (sl_host_pool_filter(&p->pool, o->include, o->exclude) != 0) return -1;

    p->nnodes = nnodes > 0 ? nnodes : 1;
    p->node_rank = o->node_rank;
    if (o->standalone && (p->nnodes > 1 || p->pool.count > 1)) return sl_errorf("--standalone runs on one node; it cannot be combined with several nodes");
    switch (p->backend) {
    case BACKEND_FORK:
        if (p->pool.count > 1 || (o->hostfile[0] && strcmp(p->pool.hosts[0].name, "localhost") != 0 &&
                                  strcmp(p->pool.hosts[0].name, p->hostname) != 0))
            return sl_errorf("--backend fork runs workers on this host only; use mpirun or srun for the hosts in %s", o->hostfile);
        if (o->hostfile[0]) p->nnodes = 1;
        if (p->node_rank >= p->nnodes) return sl_errorf("--node-rank %d must be below --nnodes %d", p->node_rank, p->nnodes);
        p->local_world_size = sl_host_pool_world_size(&p->pool);
        p->world_size = p->local_world_size * p->nnodes;
        break;
    case BACKEND_MPIRUN:
        if (!o->hostfile[0] && p->nnodes > 1)
            return sl_errorf("--nnodes %d with mpirun needs --hostfile (or run inside a SLURM allocation)", p->nnodes);
        if (o->node_rank != 0) return sl_errorf("--node-rank is for --backend fork (mpirun starts every node itself)");
        p->world_size = sl_host_pool_world_size(&p->pool);
        break;
    case BACKEND_SRUN:
        if (o->nnodes <= 0 && o->num_nodes <= 0 && getenv("SLURM_JOB_NUM_NODES")) {
            int m = atoi(getenv("SLURM_JOB_NUM_NODES"));
            if (m > 0) p->nnodes = m;
        }
        if (o->node_rank != 0) return sl_errorf("--node-rank is for --backend fork (srun starts every node itself)");
        p->world_size = sl_host_pool_world_size(&p->pool) * p->nnodes;
        break;
    }

    // rendezvous
    const char *env_addr = getenv("MASTER_ADDR"), *env_port = getenv("MASTER_PORT");
    if (o->standalone) snprintf(p->master_addr, sizeof p->master_addr, "127.0.0.1");
    else if (o->master_addr[0]) snprintf(p->master_addr, sizeof p->master_addr, "%s", o->master_addr);
    else if (env_addr && env_addr[0]) snprintf(p->master_addr, sizeof p->master_addr, "%s", env_addr);
    else if (o->hostfile[0] && strcmp(p->pool.hosts[0].name, "localhost") != 0 && p->pool.count > 1)
        snprintf(p->master_addr, sizeof p->master_addr, "%s", p->pool.hosts[0].name);
    else snprintf(p->master_addr, sizeof p->master_addr, "127.0.0.1");
    p->master_port = o->master_port > 0 ? o->master_port : (env_port && atoi(env_port) > 0 ? atoi(env_port) : 29500);
    return 0;
}

void launch_plan_free(launch_plan *p) {
    sl_host_pool_free(&p->pool);
    free(p->prog_argv);
    p->prog_argv = NULL;
}

int launch_set_common_env(const launch_opts *o, const launch_plan *p, int attempt) {
    char port[16], count[16];
    snprintf(port, sizeof port, "%d", p->master_port);
    snprintf(count, sizeof count, "%d", attempt);
    setenv("MASTER_ADDR", p->master_addr, 1);
    setenv("MASTER_PORT", port, 1);
    setenv("SHARDLM_LAUNCHER", "1", 1);
    setenv("SHARDLM_RESTART_COUNT", count, 1);
    if (o->log_dir[0]) setenv("SHARDLM_LOG_DIR", o->log_dir, 1);
    // mpirun gives each rank a pseudo-terminal: the ranks learn from this whether the output really
    // ends on a terminal (sl_progress: "\r" progress there, plain lines otherwise)
    setenv("SHARDLM_TERMINAL", isatty(STDOUT_FILENO) ? "1" : "0", 1);
    return 0;
}

const char *const launch_common_env_names[] = {"MASTER_ADDR", "MASTER_PORT", "SHARDLM_LAUNCHER", "SHARDLM_RESTART_COUNT",
                                               "SHARDLM_LOG_DIR", "SHARDLM_TERMINAL", NULL};

int launch_devices_spec(const launch_plan *p, char *buf, int cap) {
    int off = 0;
    buf[0] = '\0';
    for (int h = 0; h < p->pool.count; h++) {
        if (h) { if (off + 2 > cap) return -1; buf[off++] = '@'; buf[off] = '\0'; }
        if (sl_host_slots_string(&p->pool.hosts[h], buf + off, cap - off) != 0) return -1;
        off += (int)strlen(buf + off);
    }
    return 0;
}


void launch_print_quoted(FILE *f, const char *s) {
    int plain = s[0] != '\0';
    for (const char *c = s; *c; c++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-", *c)) plain = 0;
    if (plain) { fputs(s, f); return; }
    fputc('\'', f);
    for (const char *c = s; *c; c++) {
        if (*c == '\'') fputs("'\\''", f);
        else fputc(*c, f);
    }
    fputc('\'', f);
}


void launch_print_argv(FILE *f, char **v) {
    for (int i = 0; v[i]; i++) {
        if (i) fputc(' ', f);
        launch_print_quoted(f, v[i]);
    }
    fputc('\n', f);
}


void launch_print_plan(FILE *f, const launch_opts *o, const launch_plan *p) {
    fprintf(f, "# shardlm launch: backend %s, world size %d, nodes %d, master %s:%d\n", launch_backend_name[p->backend],
            p->world_size, p->backend == BACKEND_MPIRUN ? p->pool.count : p->nnodes, p->master_addr, p->master_port);
    for (int h = 0; h < p->pool.count; h++) {
        char slots[1024];
        if (sl_host_slots_string(&p->pool.hosts[h], slots, sizeof slots) != 0) snprintf(slots, sizeof slots, "...");
        fprintf(f, "# host %s slots %s%s%s\n", p->pool.hosts[h].name, slots, p->deepspeed_devices ? " CUDA_VISIBLE_DEVICES=" : "",
                p->deepspeed_devices ? slots : "");
    }
    if (o->log_dir[0]) fprintf(f, "# logs %s/rank_N.log\n", o->log_dir);
    if (o->max_restarts) fprintf(f, "# max restarts %d\n", o->max_restarts);
    if (o->hang_timeout_s) fprintf(f, "# hang timeout %d s\n", o->hang_timeout_s);
    else fprintf(f, "# hang timeout off\n");
}

void launch_print_sbatch(const launch_opts *o, const launch_plan *p) {
    int nodes = p->nnodes;
    int per_node = o->nproc_per_node > 0 ? o->nproc_per_node : (o->num_gpus > 0 ? o->num_gpus : 1);
    printf("#!/bin/bash\n");
    printf("# generated by: shardlm launch --print-sbatch (submit with: sbatch FILE)\n");
    printf("#SBATCH --job-name=%s\n", o->job_name);
    printf("#SBATCH --nodes=%d\n", nodes);
    printf("#SBATCH --ntasks-per-node=%d\n", per_node);
    printf("#SBATCH --cpus-per-task=%d\n", o->cpus_per_task);
    printf("#SBATCH --time=%s\n", o->sbatch_time);
    if (o->log_dir[0]) printf("# SLURM does not create directories: mkdir -p %s before sbatch\n#SBATCH --output=%s/slurm-%%j.out\n", o->log_dir, o->log_dir);
    else printf("#SBATCH --output=%s-%%j.out\n", o->job_name);
    printf("set -euo pipefail\n\n");
    printf("# rank 0's node is the rendezvous point\n");
    printf("export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1)\n");
    printf("export MASTER_PORT=%d\n", p->master_port);
    printf("export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK\n");
    printf("export SHARDLM_LAUNCHER=1\n");
    if (o->log_dir[0]) { printf("export SHARDLM_LOG_DIR="); launch_print_quoted(stdout, o->log_dir); printf("\nmkdir -p \"$SHARDLM_LOG_DIR\"\n"); }
    printf("\n# one task per rank; each detects its rank from SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID\n");
    printf("srun --kill-on-bad-exit=1 --cpus-per-task=$SLURM_CPUS_PER_TASK");
    if (o->log_dir[0]) { printf(" --output="); launch_print_quoted(stdout, o->log_dir); printf("/rank_%%t.log"); }
    for (int i = 0; i < p->prog_argc; i++) {
        printf(" ");
        launch_print_quoted(stdout, p->prog_argv[i]);
    }
    printf("\n");
}
