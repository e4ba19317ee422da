// launch_backends.c: starting a planned group on its backend and supervising it until it ends.
// fork: one worker wrapper (launch_worker.c) forked per local rank with RANK / WORLD_SIZE / LOCAL_RANK
// ... exported; the first failure stops the others (SIGTERM, SIGKILL after the grace period).
// mpirun / srun: their command line, each rank running `shardlm launch --as-worker`, started in its
// own process group and tied to the launcher's life. Either way the launcher's signals are forwarded
// and the group's exit code is the first failed rank's (launch_status.c names it).
#include "cli/launch.h"
#include "shardlm/error.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>


static int av_push(argv_list *l, char *s) {
    if (l->n + 2 > l->cap) {
        int cap = l->cap ? l->cap * 2 : 32;
        char **v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v) return sl_errorf("out of memory");
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = s;
    l->v[l->n] = NULL;
    return 0;
}


__attribute__((format(printf, 2, 3))) static int av_pushf(argv_list *l, const char *fmt, ...) {
    if (l->nowned == (int)(sizeof l->owned / sizeof l->owned[0])) return sl_errorf("too many arguments");
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int r = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (r < 0) return sl_errorf("out of memory");
    l->owned[l->nowned++] = s;
    return av_push(l, s);
}


void launch_argv_free(argv_list *l) {
    for (int i = 0; i < l->nowned; i++) free(l->owned[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

// The wrapper command every mpirun / srun rank runs: shardlm launch --as-worker ... -- PROGRAM ARGS
static int push_wrapper(argv_list *l, const launch_opts *o, const launch_plan *p) {
    if (av_push(l, (char *)p->self_exe) || av_push(l, "launch") || av_push(l, "--as-worker")) return -1;
    if (p->status_dir[0] && (av_push(l, "--status-dir") || av_push(l, (char *)p->status_dir))) return -1;
    if (o->log_dir[0] && (av_push(l, "--log-dir") || av_push(l, (char *)o->log_dir))) return -1;
    if (o->tee && av_pushf(l, "--tee=%d", o->tee)) return -1;
    if (av_pushf(l, "--grace-period=%d", o->grace_s) || av_pushf(l, "--hang-timeout=%d", o->hang_timeout_s)) return -1;
    if (p->deepspeed_devices) {
        char spec[LAUNCH_PATH_MAX];
        if (launch_devices_spec(p, spec, sizeof spec) != 0) return sl_errorf("device list too long");
        if (av_pushf(l, "--devices=%s", spec)) return -1;
    }
    if (av_push(l, "--")) return -1;
    for (int i = 0; i < p->prog_argc; i++)
        if (av_push(l, p->prog_argv[i])) return -1;
    return 0;
}


static int build_mpirun(argv_list *l, const launch_opts *o, const launch_plan *p) {
    if (av_push(l, "mpirun")) return -1;
    if (geteuid() == 0 && av_push(l, "--allow-run-as-root")) return -1;
    int single_local = p->pool.count == 1 && !o->hostfile[0];
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (single_local && p->world_size > cores && av_push(l, "--oversubscribe")) return -1;
    if (av_push(l, "-np") || av_pushf(l, "%d", p->world_size)) return -1;
    if (av_push(l, "--bind-to") || av_push(l, "none") || av_push(l, "--map-by") || av_push(l, "slot")) return -1;
    if (av_push(l, "--stdin") || av_push(l, "none")) return -1;
    if (av_push(l, "--mca") || av_push(l, "odls_base_sigkill_timeout") || av_pushf(l, "%d", o->grace_s + 1)) return -1;
    if (!single_local) {
        char hosts[LAUNCH_PATH_MAX];
        int off = 0;
        for (int h = 0; h < p->pool.count; h++) {
            int w = snprintf(hosts + off, sizeof hosts - (size_t)off, "%s%s:%d", h ? "," : "", p->pool.hosts[h].name,
                             p->pool.hosts[h].slot_count);
            if (w < 0 || w >= (int)sizeof hosts - off) return sl_errorf("host list too long for --host");
            off += w;
        }
        if (av_push(l, "--host") || av_pushf(l, "%s", hosts)) return -1;
    }
    for (int i = 0; launch_common_env_names[i]; i++) {
        const char *v = getenv(launch_common_env_names[i]);
        if (v && (av_push(l, "-x") || av_pushf(l, "%s=%s", launch_common_env_names[i], v))) return -1;
    }
    return push_wrapper(l, o, p);
}


static int build_srun(argv_list *l, const launch_opts *o, const launch_plan *p) {
    if (av_push(l, "srun")) return -1;
    if (av_pushf(l, "--ntasks=%d", p->world_size)) return -1;
    if (av_pushf(l, "--nodes=%d", p->nnodes) || av_pushf(l, "--ntasks-per-node=%d", p->world_size / p->nnodes)) return -1;
    if (av_push(l, "--kill-on-bad-exit=1")) return -1;
    return push_wrapper(l, o, p);
}

int launch_build_command(argv_list *l, const launch_opts *o, const launch_plan *p) {
    return p->backend == BACKEND_MPIRUN ? build_mpirun(l, o, p) : build_srun(l, o, p);
}

int launch_run_fork_group(const launch_opts *o, const launch_plan *p, int attempt) {
    int n = p->local_world_size;
    int base = p->node_rank * n;
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    int *codes = calloc((size_t)n, sizeof *codes);
    if (!pids || !codes) { free(pids); free(codes); fprintf(stderr, "error: out of memory\n"); return 1; }
    char devices[LAUNCH_PATH_MAX] = "";
    if (p->deepspeed_devices) sl_host_slots_string(&p->pool.hosts[0], devices, sizeof devices);
    fflush(stdout);
    fflush(stderr);
    pid_t launcher = getpid();
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            setpgid(0, 0);  // the terminal's Ctrl-C reaches the launcher only; it forwards once
            char v[32];
            int rank = base + i;
#define SETI(name, val) (snprintf(v, sizeof v, "%d", (val)), setenv(name, v, 1))
            SETI("SHARDLM_RANK", rank); SETI("RANK", rank);
            SETI("SHARDLM_WORLD_SIZE", p->world_size); SETI("WORLD_SIZE", p->world_size);
            SETI("SHARDLM_LOCAL_RANK", i); SETI("LOCAL_RANK", i);
            SETI("SHARDLM_LOCAL_WORLD_SIZE", n); SETI("LOCAL_WORLD_SIZE", n);
            SETI("SHARDLM_NODE_RANK", p->node_rank); SETI("GROUP_RANK", p->node_rank);
#undef SETI
            if (devices[0]) setenv("CUDA_VISIBLE_DEVICES", devices, 1);
            launch_clear_pending_signals();
            // the launcher's death (even by SIGKILL) reaches the wrapper as SIGTERM: it stops its program
            if (sl_die_with_parent(SIGTERM, launcher) != 0) _exit(128 + SIGTERM);
            worker_spec w = {.rank = rank, .log_dir = o->log_dir[0] ? o->log_dir : NULL, .tee = o->tee,
                             .status_dir = p->status_dir, .grace_s = o->grace_s, .hang_timeout_s = o->hang_timeout_s,
                             .append = attempt > 0, .argv = p->prog_argv};
            fflush(NULL);
            _exit(launch_worker_run(&w));
        }
        if (pid < 0) {
            fprintf(stderr, "shardlm launch: fork: %s\n", strerror(errno));
            n = i;
            break;
        }
        setpgid(pid, pid);
        pids[i] = pid;
    }
    int alive = n, stopping = n < p->local_world_size, rc = 0;
    double kill_at = 0;
    if (stopping) {
        for (int i = 0; i < n; i++) kill(pids[i], SIGTERM);
        kill_at = launch_now_s() + o->grace_s + 5;
        rc = 1;
    }
    while (alive > 0) {
        int sig;
        while ((sig = launch_take_pending_signal()) != 0) {
            fprintf(stderr, "shardlm launch: received %s, forwarding to %d workers\n", launch_signal_name(sig), alive);
            for (int i = 0; i < n; i++)
                if (pids[i] > 0) kill(pids[i], sig);
            if (!kill_at && sig != SIGUSR1 && sig != SIGUSR2) kill_at = launch_now_s() + o->grace_s + 5;
        }
        for (int i = 0; i < n; i++) {
            if (pids[i] <= 0) continue;
            int st;
            pid_t r = waitpid(pids[i], &st, WNOHANG);
            if (r != pids[i]) continue;
            pids[i] = -1;
            alive--;
            codes[i] = launch_exit_code_of(st);
            if (codes[i] != 0 && !rc) rc = codes[i];
            if (codes[i] != 0 && !stopping) {
                stopping = 1;
                for (int k = 0; k < n; k++)
                    if (pids[k] > 0) kill(pids[k], SIGTERM);
                kill_at = launch_now_s() + o->grace_s + 5;
            }
        }
        if (kill_at && launch_now_s() > kill_at) {
            for (int i = 0; i < n; i++)
                if (pids[i] > 0) kill(-pids[i], SIGKILL), kill(pids[i], SIGKILL);
            kill_at = 0;
        }
        if (alive > 0) launch_sleep_ms(20);
    }
    free(pids);
    free(codes);
    if (rc != 0) {
        worker_status s;
        if (launch_first_failure(p, base, p->local_world_size, &s) >= 0) {
            if (!launch_first_signal()) launch_report_failure(o, &s);
            rc = s.code;
        } else {
            if (!launch_first_signal()) fprintf(stderr, "shardlm launch: a worker failed with code %d\n", rc);
        }
    }
    return rc;
}

int launch_run_external_group(const launch_opts *o, const launch_plan *p, char **cmd) {
    fflush(stdout);
    fflush(stderr);
    pid_t launcher = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        launch_reset_signals();
        // the launcher's death reaches mpirun / srun as SIGTERM, which they pass to every rank (Open MPI 4
        // has no option of its own that ties mpirun to its parent)
        if (sl_die_with_parent(SIGTERM, launcher) != 0) _exit(128 + SIGTERM);
        execvp(cmd[0], cmd);
        fprintf(stderr, "error: cannot run %s: %s\n", cmd[0], strerror(errno));
        _exit(127);
    }
    if (pid < 0) { fprintf(stderr, "error: fork: %s\n", strerror(errno)); return 1; }
    setpgid(pid, pid);
    int st = 0;
    for (;;) {
        int sig;
        while ((sig = launch_take_pending_signal()) != 0) {
            // srun treats one SIGINT as "report status"; SIGTERM is what it forwards to the tasks
            int fwd = (p->backend == BACKEND_SRUN && sig == SIGINT) ? SIGTERM : sig;
            fprintf(stderr, "shardlm launch: received %s, forwarding to %s\n", launch_signal_name(sig), launch_backend_name[p->backend]);
            kill(pid, fwd);
        }
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) break;
        launch_sleep_ms(20);
    }
    int rc = launch_exit_code_of(st);
    if (rc == 0) return 0;
    worker_status s;
    if (launch_first_failure(p, 0, p->world_size, &s) >= 0) {
        if (!launch_first_signal()) launch_report_failure(o, &s);
        return s.code;
    }
    fprintf(stderr, "shardlm launch: %s exited with code %d (no worker status found in %s; see %s's messages above)\n",
            launch_backend_name[p->backend], rc, p->status_dir, launch_backend_name[p->backend]);
    return rc;
}
