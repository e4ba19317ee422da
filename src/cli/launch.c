// launch.c: `shardlm launch`: torchrun's and DeepSpeed's launcher on top of srun, mpirun or plain
// fork/exec. This file is the command: its flags, and the attempts loop that exports the rendezvous
// variables, starts the group, and relaunches it up to --max-restarts times; --dry-run and
// --print-sbatch print the plan instead. The parts it drives are listed in launch.h (planning,
// backends, the worker wrapper, status files, supervision). Invariant: the launcher never exits
// before its direct children have been reaped.
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/launch.h"
#include "shardlm/error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f,
        "usage: shardlm launch [launcher flags] [--] PROGRAM [ARGS...]\n\n"
        "Starts PROGRAM on every rank, like torchrun / the deepspeed launcher. PROGRAM is a shardlm\n"
        "command (`train ...` runs this shardlm binary) or any executable.\n"
        "Backend: srun inside a SLURM allocation, else mpirun (Open MPI); --backend fork starts the\n"
        "workers on this host itself and sets RANK/WORLD_SIZE/LOCAL_RANK/... (and SHARDLM_* twins).\n\n"
        "torchrun flags:\n"
        "  --nproc-per-node N      workers per node (also --nproc_per_node; default 1)\n"
        "  --nnodes N              nodes (fork: this launcher runs one node; srun: --nodes)\n"
        "  --node-rank R           this node's index with --backend fork and --nnodes > 1\n"
        "  --master-addr A         rendezvous address exported as MASTER_ADDR (default: $MASTER_ADDR,\n"
        "                          the hostfile's first host, else 127.0.0.1)\n"
        "  --master-port P         MASTER_PORT (default $MASTER_PORT or 29500)\n"
        "  --standalone            single node on 127.0.0.1\n"
        "  --max-restarts N        relaunch the whole group up to N times after a failure (default 0);\n"
        "                          workers see SHARDLM_RESTART_COUNT=k\n"
        "  --log-dir DIR           each rank's stdout+stderr -> DIR/rank_N.log (exported as SHARDLM_LOG_DIR)\n"
        "  --tee 0|1|2|3           streams also shown on the terminal as \"[rank N] ...\": 1 stdout,\n"
        "                          2 stderr, 3 both (default 0; without --log-dir only prefixes)\n"
        "DeepSpeed flags (the selected slots become each host's CUDA_VISIBLE_DEVICES):\n"
        "  --hostfile FILE         lines 'HOST slots=N' ('#' comments); runs on those hosts (mpirun)\n"
        "  --num_nodes N           use the first N hosts of the hostfile\n"
        "  --num_gpus N            use the first N slots of each host (also sizes the local pool)\n"
        "  --include SPEC          only these hosts/slots: host1:0,1@host2 (localhost:0,2 locally)\n"
        "  --exclude SPEC          all but these hosts/slots (same syntax)\n"
        "  --master_addr A, --master_port P   as above\n"
        "shardlm flags:\n"
        "  --backend B             auto | mpirun | srun | fork (default auto)\n"
        "  --grace-period S        seconds between SIGTERM and SIGKILL when stopping workers (default 5;\n"
        "                          mpirun waits about twice this after a failure)\n"
        "  --hang-timeout S        a rank whose heartbeat (shardlm train writes one) stops for S seconds is\n"
        "                          reported by rank and host, killed, and the job stopped (exit 124);\n"
        "                          0 = off (default 300)\n"
        "  --dry-run               print the plan and the command, run nothing\n"
        "  --print-sbatch          print a SLURM batch script for this job and exit; with\n"
        "                          --time HH:MM:SS (default 01:00:00), --cpus-per-task N (default 4),\n"
        "                          --job-name NAME (default shardlm)\n"
        "  --help                  this text\n\n"
        "A failed worker stops the others; launch exits with its code (128+signal if killed).\n"
        "SIGINT/SIGTERM are forwarded to the workers (mpirun/srun turn them into SIGTERM).\n");
}

// Matches the dash or underscore spelling of an integer flag whose values lie in [lo, hi].
static int flag_int2(sl_args *a, const char *n1, const char *n2, int lo, int hi, int *out) {
    return sl_arg_int(a, n1, lo, hi, out) || (n2 && sl_arg_int(a, n2, lo, hi, out));
}
static int flag_str2(sl_args *a, const char *n1, const char *n2, char *out, size_t cap) {
    return sl_arg_str(a, n1, out, cap) || (n2 && sl_arg_str(a, n2, out, cap));
}

// Returns 0 to go on, 1 after --help, -1 on a bad flag (message printed).
static int parse_launch_flags(int argc, char **argv, launch_opts *o) {
    memset(o, 0, sizeof *o);
    o->nproc_per_node = o->nnodes = o->master_port = o->num_gpus = o->num_nodes = -1;
    o->grace_s = 5;
    o->hang_timeout_s = 300;
    o->cpus_per_task = 4;
    snprintf(o->backend, sizeof o->backend, "auto");
    snprintf(o->sbatch_time, sizeof o->sbatch_time, "01:00:00");
    snprintf(o->job_name, sizeof o->job_name, "shardlm");
    o->prog = -1;
    sl_args a = {.argc = argc, .argv = argv, .i = 1};
    for (; a.i < argc; a.i++) {
        const char *arg = argv[a.i];
        if (!strcmp(arg, "--")) { o->prog = a.i + 1; break; }
        if (arg[0] != '-') { o->prog = a.i; break; }
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) { usage(stdout); return 1; }
        if (!strcmp(arg, "--nnodes") || !strncmp(arg, "--nnodes=", 9)) {
            char v[64] = "";
            sl_arg_str(&a, "--nnodes", v, sizeof v);
            if (a.error) return -1;
            static const sl_num_range nodes = {1, 1000000, 1, 0};
            double n;
            if (strchr(v, ':')) { fprintf(stderr, "error: --nnodes %s: elastic ranges (MIN:MAX) are not supported; give one number\n", v); return -1; }
            if (sl_parse_number("--nnodes", v, &nodes, &n) != 0) return -1;
            o->nnodes = (int)n;
            continue;
        }
        // -1 in nproc_per_node, master_port, num_gpus, num_nodes means "not given": no flag accepts it
        if (flag_int2(&a, "--nproc-per-node", "--nproc_per_node", 1, SL_NO_MAX, &o->nproc_per_node) ||
            flag_int2(&a, "--node-rank", "--node_rank", 0, SL_NO_MAX, &o->node_rank) ||
            flag_int2(&a, "--master-port", "--master_port", 1, 65535, &o->master_port) ||
            flag_int2(&a, "--max-restarts", "--max_restarts", 0, SL_NO_MAX, &o->max_restarts) ||
            flag_int2(&a, "--num_gpus", "--num-gpus", 1, SL_NO_MAX, &o->num_gpus) ||
            flag_int2(&a, "--num_nodes", "--num-nodes", 1, SL_NO_MAX, &o->num_nodes) ||
            flag_int2(&a, "--grace-period", NULL, 0, 86400, &o->grace_s) ||
            flag_int2(&a, "--hang-timeout", NULL, 0, 604800, &o->hang_timeout_s) ||
            flag_int2(&a, "--cpus-per-task", NULL, 1, SL_NO_MAX, &o->cpus_per_task) ||
            flag_int2(&a, "--tee", NULL, 0, 3, &o->tee) ||
            flag_str2(&a, "--master-addr", "--master_addr", o->master_addr, sizeof o->master_addr) ||
            flag_str2(&a, "--log-dir", "--log_dir", o->log_dir, sizeof o->log_dir) ||
            flag_str2(&a, "--include", NULL, o->include, sizeof o->include) ||
            flag_str2(&a, "--exclude", NULL, o->exclude, sizeof o->exclude) ||
            flag_str2(&a, "--hostfile", NULL, o->hostfile, sizeof o->hostfile) ||
            flag_str2(&a, "--backend", NULL, o->backend, sizeof o->backend) ||
            flag_str2(&a, "--time", NULL, o->sbatch_time, sizeof o->sbatch_time) ||
            flag_str2(&a, "--job-name", NULL, o->job_name, sizeof o->job_name) ||
            flag_str2(&a, "--status-dir", NULL, o->status_dir, sizeof o->status_dir) ||
            flag_str2(&a, "--devices", NULL, o->devices, sizeof o->devices)) {
            if (a.error) return -1;
            continue;
        }
        if (sl_arg_switch(&a, "--standalone")) { o->standalone = 1; continue; }
        if (sl_arg_switch(&a, "--dry-run")) { o->dry_run = 1; continue; }
        if (sl_arg_switch(&a, "--print-sbatch")) { o->print_sbatch = 1; continue; }
        if (sl_arg_switch(&a, "--as-worker")) { o->as_worker = 1; continue; }
        fprintf(stderr, "error: unknown flag '%s' for shardlm launch (see shardlm launch --help)\n", arg);
        return -1;
    }
    if (o->prog < 0 || o->prog >= argc) {
        fprintf(stderr, "error: shardlm launch needs a PROGRAM to run (e.g. `shardlm launch --nproc-per-node 2 train ...`)\n");
        return -1;
    }
    if (o->nproc_per_node > 0 && o->num_gpus > 0 && o->nproc_per_node != o->num_gpus) {
        fprintf(stderr, "error: --nproc-per-node %d and --num_gpus %d disagree; give one\n", o->nproc_per_node, o->num_gpus);
        return -1;
    }
    if (o->nnodes > 0 && o->num_nodes > 0 && o->nnodes != o->num_nodes) {
        fprintf(stderr, "error: --nnodes %d and --num_nodes %d disagree; give one\n", o->nnodes, o->num_nodes);
        return -1;
    }
    if (strcmp(o->backend, "auto") && strcmp(o->backend, "fork") && strcmp(o->backend, "mpirun") && strcmp(o->backend, "srun")) {
        fprintf(stderr, "error: --backend expects auto, mpirun, srun or fork, got '%s'\n", o->backend);
        return -1;
    }
    return 0;
}

static int launch_attempts(const launch_opts *o, launch_plan *p) {
    int rc = 0;
    for (int attempt = 0; attempt <= o->max_restarts; attempt++) {
        if (attempt > 0) fprintf(stderr, "shardlm launch: restarting (attempt %d of %d)\n", attempt, o->max_restarts);
        launch_set_common_env(o, p, attempt);
        launch_clear_status(p->status_dir, p->world_size);
        if (p->backend == BACKEND_FORK) {
            rc = launch_run_fork_group(o, p, attempt);
        } else {
            argv_list cmd = {0};
            if (launch_build_command(&cmd, o, p) != 0) {
                launch_argv_free(&cmd);
                fprintf(stderr, "error: %s\n", sl_error());
                return 1;
            }
            rc = launch_run_external_group(o, p, cmd.v);
            launch_argv_free(&cmd);
        }
        if (launch_first_signal()) {
            if (rc == 0) rc = 128 + launch_first_signal();  // the ranks exited cleanly, but the run was interrupted
            fprintf(stderr, "shardlm launch: stopped by %s (exit code %d)\n", launch_signal_name(launch_first_signal()), rc);
            break;
        }
        if (rc == 0) break;
    }
    launch_clear_status(p->status_dir, p->world_size);
    return rc;
}

int cmd_launch(int argc, char **argv) {
    launch_opts *o = calloc(1, sizeof *o);
    if (!o) { fprintf(stderr, "error: out of memory\n"); return 1; }
    int prc = parse_launch_flags(argc, argv, o);
    if (prc != 0) { free(o); return prc > 0 ? 0 : 2; }
    if (o->as_worker) {
        int rc = launch_as_worker(o, argv);
        free(o);
        return rc;
    }
    launch_plan p;
    if (launch_resolve_plan(o, argc, argv, &p) != 0) {
        fprintf(stderr, "error: %s\n", sl_error());
        launch_plan_free(&p);
        free(o);
        return 2;
    }
    int rc = 0;
    if (o->print_sbatch) {
        launch_print_sbatch(o, &p);
    } else if (o->dry_run) {
        launch_set_common_env(o, &p, 0);
        snprintf(p.status_dir, sizeof p.status_dir, "%s", o->log_dir[0] ? o->log_dir : "/tmp/shardlm_launch_XXXXXX");
        launch_print_plan(stdout, o, &p);
        if (p.backend == BACKEND_FORK) {
            char devices[LAUNCH_PATH_MAX] = "";
            if (p.deepspeed_devices) sl_host_slots_string(&p.pool.hosts[0], devices, sizeof devices);
            for (int i = 0; i < p.local_world_size; i++) {
                int rank = p.node_rank * p.local_world_size + i;
                printf("rank %d: MASTER_ADDR=%s MASTER_PORT=%d RANK=%d WORLD_SIZE=%d LOCAL_RANK=%d LOCAL_WORLD_SIZE=%d%s%s ",
                       rank, p.master_addr, p.master_port, rank, p.world_size, i, p.local_world_size,
                       devices[0] ? " CUDA_VISIBLE_DEVICES=" : "", devices);
                launch_print_argv(stdout, p.prog_argv);
            }
        } else {
            argv_list cmd = {0};
            if (launch_build_command(&cmd, o, &p) != 0) {
                fprintf(stderr, "error: %s\n", sl_error());
                rc = 2;
            } else {
                if (p.backend == BACKEND_SRUN)
                    for (int i = 0; launch_common_env_names[i]; i++)
                        if (getenv(launch_common_env_names[i])) printf("%s=%s ", launch_common_env_names[i], getenv(launch_common_env_names[i]));
                launch_print_argv(stdout, cmd.v);
            }
            launch_argv_free(&cmd);
        }
    } else {
        if (o->log_dir[0]) {
            if (launch_mkdir_p(o->log_dir) != 0) { fprintf(stderr, "error: --log-dir: %s\n", sl_error()); rc = 2; }
            snprintf(p.status_dir, sizeof p.status_dir, "%s", o->log_dir);
        } else {
            snprintf(p.status_dir, sizeof p.status_dir, "/tmp/shardlm_launch_XXXXXX");
            if (!mkdtemp(p.status_dir)) { fprintf(stderr, "error: cannot create a temporary directory: %s\n", strerror(errno)); rc = 2; }
            else p.status_dir_is_temp = 1;
        }
        if (rc == 0) {
            launch_install_forwarding();
            rc = launch_attempts(o, &p);
        }
        if (p.status_dir_is_temp) rmdir(p.status_dir);
    }
    launch_plan_free(&p);
    free(o);
    return rc;
}
