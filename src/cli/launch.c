// launch.c: `shardlm launch`: torchrun's and DeepSpeed's launcher on top of srun, mpirun or plain
// fork/exec. It resolves the hosts and slots (launch_hosts.c), exports the rendezvous variables,
// starts the group, stops every worker when one fails, names the failed rank, and relaunches the
// group up to --max-restarts times.
//
// Supervision beyond that (launch_supervise.c): the whole job dies with the launcher (parent-death
// signals), and a wrapper kills a rank whose heartbeat stops (--hang-timeout).
//
// Every worker runs inside a small supervisor ("worker wrapper", worker_run below): it starts the
// program in its own process group, writes its output to LOGDIR/rank_N.log (and, with --tee, to the
// terminal prefixed "[rank N] "), forwards signals to the whole group (SIGKILL after the grace
// period), and records how the program ended in STATUS_DIR/.status_N so the launcher can say which
// rank failed first. With --backend fork the launcher forks the wrappers itself; with mpirun/srun
// the wrapper is this binary re-executed as `shardlm launch --as-worker ...` on every rank.
// Invariants: the launcher never exits before its direct children have been reaped; a worker that
// outlives the grace period after being told to stop is killed with its whole process group.
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/launch_hosts.h"
#include "cli/launch_supervise.h"
#include "shardlm/error.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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
static const char *backend_name[] = {"fork", "mpirun", "srun"};

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

// ---------------------------------------------------------------------------------------------
// signals: handlers only record which signals arrived; loops forward them

static const int forwarded_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2};
enum { N_FORWARDED = sizeof forwarded_signals / sizeof forwarded_signals[0] };
static volatile sig_atomic_t pending_signal[N_FORWARDED];
static volatile sig_atomic_t first_signal;

static void on_forwarded_signal(int sig) {
    for (int i = 0; i < N_FORWARDED; i++)
        if (forwarded_signals[i] == sig) pending_signal[i] = 1;
    if (!first_signal) first_signal = sig;
}

static void install_forwarding(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_forwarded_signal;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < N_FORWARDED; i++) sigaction(forwarded_signals[i], &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

static void reset_signals_to_default(void) {
    for (int i = 0; i < N_FORWARDED; i++) signal(forwarded_signals[i], SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

// Returns the next pending signal (clearing it), or 0.
static int take_pending_signal(void) {
    for (int i = 0; i < N_FORWARDED; i++)
        if (pending_signal[i]) { pending_signal[i] = 0; return forwarded_signals[i]; }
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);  // EINTR is fine: the caller's loop re-checks
}

static int exit_code_of(int wstatus) {
    if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
    if (WIFSIGNALED(wstatus)) return 128 + WTERMSIG(wstatus);
    return 1;
}

static int mkdir_p(const char *path) {
    char buf[LAUNCH_PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return sl_errorf("path too long: %s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return sl_errorf("cannot create directory %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) return sl_errorf("cannot create directory %s: %s", buf, strerror(errno));
    return 0;
}

static int write_all(int fd, const char *buf, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        buf += w;
        n -= (size_t)w;
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// the worker wrapper

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

// A tee'd stream. Each line goes to the terminal as "[rank N] line\n" in a single write(), so
// lines of ranks that share the launcher's stdout never interleave mid-line.
typedef struct {
    int fd;          // read end of the program's stdout or stderr pipe; -1 when closed
    int term_fd;     // 1 or 2
    size_t len;      // bytes pending in line (prefix included); 0: none
    int mid_line;    // a line longer than the buffer went out in parts: the rest gets no prefix
    char line[4096];
} tee_stream;

static void tee_flush(tee_stream *t) {
    write_all(t->term_fd, t->line, t->len);
    t->len = 0;
}

static void tee_chunk(tee_stream *t, int log_fd, int rank, const char *buf, size_t n) {
    if (log_fd >= 0) write_all(log_fd, buf, n);
    for (size_t i = 0; i < n; i++) {
        if (t->len == 0 && !t->mid_line) t->len = (size_t)snprintf(t->line, sizeof t->line, "[rank %d] ", rank);
        t->line[t->len++] = buf[i];
        if (buf[i] == '\n') {
            tee_flush(t);
            t->mid_line = 0;
        } else if (t->len == sizeof t->line) {
            tee_flush(t);
            t->mid_line = 1;
        }
    }
}

// Ends a last unterminated line with a newline of its own.
static void tee_finish(tee_stream *t) {
    if (t->len == 0 && !t->mid_line) return;
    if (t->len == sizeof t->line) tee_flush(t);
    t->line[t->len++] = '\n';
    tee_flush(t);
    t->mid_line = 0;
}

// Reads what is available on the tee pipes (waiting up to timeout_ms); closes a pipe at EOF.
static void pump_tee(tee_stream *ts, int nts, int log_fd, int rank, int timeout_ms) {
    struct pollfd pfd[2];
    int idx[2], n = 0;
    for (int i = 0; i < nts; i++)
        if (ts[i].fd >= 0) { pfd[n].fd = ts[i].fd; pfd[n].events = POLLIN; pfd[n].revents = 0; idx[n++] = i; }
    if (n == 0) { sleep_ms(timeout_ms); return; }
    if (poll(pfd, (nfds_t)n, timeout_ms) <= 0) return;
    for (int k = 0; k < n; k++) {
        if (!(pfd[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char buf[8192];
        ssize_t r = read(pfd[k].fd, buf, sizeof buf);
        if (r > 0) {
            tee_chunk(&ts[idx[k]], log_fd, rank, buf, (size_t)r);
        } else if (r == 0 || errno != EINTR) {
            close(ts[idx[k]].fd);
            ts[idx[k]].fd = -1;
        }
    }
}

// One line: rank code signal stopped time host hung silent-seconds last-progress...
static void write_status(const worker_spec *w, const char *host, int code, int sig, int stopped, const sl_hang_watch *hang) {
    if (!w->status_dir) return;
    char path[DERIVED_PATH_MAX], tmp[DERIVED_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/.status_%d", w->status_dir, w->rank);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        mkdir_p(w->status_dir);
        f = fopen(tmp, "w");
        if (!f) return;  // e.g. a remote node without the launcher's directory: the launcher falls back
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char progress[SL_HEARTBEAT_RECORD + 1] = "-";
    if (hang) sl_hang_watch_last_progress(hang, progress, sizeof progress);
    fprintf(f, "%d %d %d %d %lld.%09ld %s %d %.1f %s\n", w->rank, code, sig, stopped, (long long)ts.tv_sec, ts.tv_nsec, host,
            hang != NULL, hang ? hang->silent_s : 0.0, progress);
    fclose(f);
    rename(tmp, path);
}

// Runs one worker program to completion under supervision; returns its exit code (128+signal
// when a signal ended it, 127 when it could not be started).
static int worker_run(const worker_spec *w) {
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    int log_fd = -1;
    if (w->log_dir) {
        char path[DERIVED_PATH_MAX];
        snprintf(path, sizeof path, "%s/rank_%d.log", w->log_dir, w->rank);
        if (mkdir_p(w->log_dir) == 0)
            log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | (w->append ? 0 : O_TRUNC) | O_CLOEXEC, 0644);
        if (log_fd < 0) {
            fprintf(stderr, "shardlm launch: rank %d: cannot open log %s: %s\n", w->rank, path, strerror(errno));
            write_status(w, host, 127, 0, 0, NULL);
            return 127;
        }
    }
    tee_stream ts[2];
    int nts = 0;
    int child_out[2] = {log_fd, log_fd};  // what the program's stdout / stderr become (-1: inherit)
    for (int s = 0; s < 2; s++) {
        if (!(w->tee & (1 << s))) continue;
        int p[2];
        if (pipe2(p, O_CLOEXEC) != 0) {
            fprintf(stderr, "shardlm launch: rank %d: pipe: %s\n", w->rank, strerror(errno));
            return 127;
        }
        ts[nts] = (tee_stream){.fd = p[0], .term_fd = s + 1};
        nts++;
        child_out[s] = p[1];
    }

    sigset_t block, old;
    sigemptyset(&block);
    for (int i = 0; i < N_FORWARDED; i++) sigaddset(&block, forwarded_signals[i]);
    sigprocmask(SIG_BLOCK, &block, &old);
    sl_hang_watch hang;
    sl_hang_watch_init(&hang, w->status_dir, w->rank, w->hang_timeout_s);
    pid_t wrapper = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        if (sl_die_with_parent(SIGKILL, wrapper) != 0) _exit(128 + SIGKILL);  // the wrapper is already gone
        sl_hang_watch_export(&hang);
        for (int s = 0; s < 2; s++)
            if (child_out[s] >= 0) dup2(child_out[s], s + 1);
        reset_signals_to_default();
        execvp(w->argv[0], w->argv);
        fprintf(stderr, "shardlm launch: rank %d: cannot run '%s': %s\n", w->rank, w->argv[0], strerror(errno));
        _exit(127);
    }
    if (pid < 0) {
        fprintf(stderr, "shardlm launch: rank %d: fork: %s\n", w->rank, strerror(errno));
        sigprocmask(SIG_SETMASK, &old, NULL);
        return 127;
    }
    setpgid(pid, pid);  // also done in the child; whichever runs first wins the race harmlessly
    for (int s = 0; s < 2; s++)
        if (w->tee & (1 << s)) close(child_out[s]);  // the program holds the write ends
    install_forwarding();
    sigprocmask(SIG_SETMASK, &old, NULL);

    int wstatus = 0, stopped = 0, hung = 0;
    double kill_at = 0;
    for (;;) {
        int sig;
        while ((sig = take_pending_signal()) != 0) {
            kill(-pid, sig);
            if (sig != SIGUSR1 && sig != SIGUSR2 && !stopped) {
                stopped = 1;
                kill_at = now_s() + w->grace_s;
            }
        }
        pid_t r = waitpid(pid, &wstatus, WNOHANG);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) { wstatus = 127 << 8; break; }
        if (!stopped && !hung && sl_hang_watch_tripped(&hang, w->rank, host, now_s())) {
            kill(-pid, SIGKILL);  // a stopped or stuck process cannot act on SIGTERM
            hung = 1;
        }
        if (stopped && kill_at > 0 && now_s() >= kill_at) {
            fprintf(stderr, "shardlm launch: rank %d did not stop within %d s; sending SIGKILL\n", w->rank, w->grace_s);
            kill(-pid, SIGKILL);
            kill_at = 0;
        }
        pump_tee(ts, nts, log_fd, w->rank, 50);
    }
    kill(-pid, SIGKILL);  // whatever the program left behind in its process group
    double drain_until = now_s() + 2.0;
    for (;;) {
        int open_pipes = 0;
        for (int i = 0; i < nts; i++) open_pipes += ts[i].fd >= 0;
        if (!open_pipes || now_s() > drain_until) break;
        pump_tee(ts, nts, log_fd, w->rank, 100);
    }
    for (int i = 0; i < nts; i++) {
        if (ts[i].fd >= 0) close(ts[i].fd);
        tee_finish(&ts[i]);
    }
    if (log_fd >= 0) close(log_fd);
    int code = hung ? SL_HUNG_EXIT_CODE : exit_code_of(wstatus);
    write_status(w, host, code, hung || !WIFSIGNALED(wstatus) ? 0 : WTERMSIG(wstatus), stopped, hung ? &hang : NULL);
    return code;
}

// ---------------------------------------------------------------------------------------------
// flags

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

// ---------------------------------------------------------------------------------------------
// plan

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

static int resolve_plan(const launch_opts *o, int argc, char **argv, launch_plan *p) {
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

static void plan_free(launch_plan *p) {
    sl_host_pool_free(&p->pool);
    free(p->prog_argv);
    p->prog_argv = NULL;
}

// ---------------------------------------------------------------------------------------------
// argv building and printing

typedef struct {
    char **v;
    int n, cap;
    char *owned[64];  // strings this list allocated
    int nowned;
} argv_list;

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

static void av_free(argv_list *l) {
    for (int i = 0; i < l->nowned; i++) free(l->owned[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static void print_quoted(FILE *f, const char *s) {
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

static void print_argv(FILE *f, char **v) {
    for (int i = 0; v[i]; i++) {
        if (i) fputc(' ', f);
        print_quoted(f, v[i]);
    }
    fputc('\n', f);
}

// "0,1@0" : each host's selected slots in rank order (the wrapper's --devices).
static int devices_spec(const launch_plan *p, char *buf, int cap) {
    int off = 0;
    buf[0] = '\0';
    for (int h = 0; h < p->pool.count; h++) {
        if (h) { if (off + 2 > cap) return -1; buf[off++] = '@'; buf[off] = '\0'; }
        if (sl_host_slots_string(&p->pool.hosts[h], buf + off, cap - off) != 0) return -1;
        off += (int)strlen(buf + off);
    }
    return 0;
}

// The variables every backend exports (the process's own environment is set to these too).
static int set_common_env(const launch_opts *o, const launch_plan *p, int attempt) {
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

static const char *const common_env_names[] = {"MASTER_ADDR", "MASTER_PORT", "SHARDLM_LAUNCHER", "SHARDLM_RESTART_COUNT",
                                               "SHARDLM_LOG_DIR", "SHARDLM_TERMINAL", NULL};

// The wrapper command every mpirun / srun rank runs: shardlm launch --as-worker ... -- PROGRAM ARGS
static int push_wrapper(argv_list *l, const launch_opts *o, const launch_plan *p) {
    if (av_push(l, (char *)p->self_exe) || av_push(l, "launch") || av_push(l, "--as-worker")) return -1;
    if (p->status_dir[0] && (av_push(l, "--status-dir") || av_push(l, (char *)p->status_dir))) return -1;
    if (o->log_dir[0] && (av_push(l, "--log-dir") || av_push(l, (char *)o->log_dir))) return -1;
    if (o->tee && av_pushf(l, "--tee=%d", o->tee)) return -1;
    if (av_pushf(l, "--grace-period=%d", o->grace_s) || av_pushf(l, "--hang-timeout=%d", o->hang_timeout_s)) return -1;
    if (p->deepspeed_devices) {
        char spec[LAUNCH_PATH_MAX];
        if (devices_spec(p, spec, sizeof spec) != 0) return sl_errorf("device list too long");
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
    for (int i = 0; common_env_names[i]; i++) {
        const char *v = getenv(common_env_names[i]);
        if (v && (av_push(l, "-x") || av_pushf(l, "%s=%s", common_env_names[i], v))) return -1;
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

static void print_plan(FILE *f, const launch_opts *o, const launch_plan *p) {
    fprintf(f, "# shardlm launch: backend %s, world size %d, nodes %d, master %s:%d\n", backend_name[p->backend],
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

// ---------------------------------------------------------------------------------------------
// running a group and reporting the first failure

typedef struct {
    int found;
    int rank, code, sig, stopped, hung;
    double time, silent_s;
    char host[256];
    char progress[SL_HEARTBEAT_RECORD + 1];  // a hung rank's last heartbeat: "step 12 training"
} worker_status;

static int read_status(const char *dir, int rank, worker_status *s) {
    char path[DERIVED_PATH_MAX];
    snprintf(path, sizeof path, "%s/.status_%d", dir, rank);
    FILE *f = fopen(path, "r");
    memset(s, 0, sizeof *s);
    if (!f) return -1;
    int ok = fscanf(f, "%d %d %d %d %lf %255s %d %lf ", &s->rank, &s->code, &s->sig, &s->stopped, &s->time, s->host, &s->hung,
                    &s->silent_s) == 8;
    if (ok && fgets(s->progress, sizeof s->progress, f)) s->progress[strcspn(s->progress, "\n")] = '\0';
    fclose(f);
    s->found = ok;
    return ok ? 0 : -1;
}

// Removes the status and heartbeat files of every rank.
static void clear_status(const char *dir, int world) {
    char path[DERIVED_PATH_MAX];
    for (int r = 0; r < world; r++) {
        snprintf(path, sizeof path, "%s/.status_%d", dir, r);
        unlink(path);
        snprintf(path, sizeof path, "%s/.heartbeat_%d", dir, r);
        unlink(path);
    }
}

// The first worker that failed on its own (not stopped by us), else the first that failed at all.
static int first_failure(const launch_plan *p, int first_rank, int count, worker_status *out) {
    int best = -1;
    worker_status s;
    for (int pass = 0; pass < 2 && best < 0; pass++) {
        for (int r = first_rank; r < first_rank + count; r++) {
            if (read_status(p->status_dir, r, &s) != 0 || s.code == 0) continue;
            if (pass == 0 && s.stopped) continue;
            if (best < 0 || s.time < out->time) { *out = s; best = r; }
        }
    }
    return best;
}

static const char *signal_name(int sig) {
    switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGKILL: return "SIGKILL";
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGHUP: return "SIGHUP";
    case SIGFPE: return "SIGFPE";
    default: return "signal";
    }
}

static void report_failure(const launch_opts *o, const worker_status *s) {
    char logs[LAUNCH_PATH_MAX + 64] = "";
    if (o->log_dir[0]) snprintf(logs, sizeof logs, " (log: %s/rank_%d.log)", o->log_dir, s->rank);
    if (s->hung)
        fprintf(stderr, "shardlm launch: rank %d on host %s hung: no heartbeat for %.1f s (last: %s); it was killed and the "
                "job stopped, exit code %d%s\n", s->rank, s->host, s->silent_s, s->progress, s->code, logs);
    else if (s->sig)
        fprintf(stderr, "shardlm launch: rank %d on host %s was killed by signal %d (%s), exit code %d%s\n", s->rank, s->host,
                s->sig, signal_name(s->sig), s->code, logs);
    else
        fprintf(stderr, "shardlm launch: rank %d on host %s exited with code %d%s\n", s->rank, s->host, s->code, logs);
}

// Forks one wrapper per local rank and supervises them. Returns the group's exit code.
static int run_fork_group(const launch_opts *o, const launch_plan *p, int attempt) {
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
            for (int k = 0; k < N_FORWARDED; k++) pending_signal[k] = 0;
            // the launcher's death (even by SIGKILL) reaches the wrapper as SIGTERM: it stops its program
            if (sl_die_with_parent(SIGTERM, launcher) != 0) _exit(128 + SIGTERM);
            worker_spec w = {.rank = rank, .log_dir = o->log_dir[0] ? o->log_dir : NULL, .tee = o->tee,
                             .status_dir = p->status_dir, .grace_s = o->grace_s, .hang_timeout_s = o->hang_timeout_s,
                             .append = attempt > 0, .argv = p->prog_argv};
            fflush(NULL);
            _exit(worker_run(&w));
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
        kill_at = now_s() + o->grace_s + 5;
        rc = 1;
    }
    while (alive > 0) {
        int sig;
        while ((sig = take_pending_signal()) != 0) {
            fprintf(stderr, "shardlm launch: received %s, forwarding to %d workers\n", signal_name(sig), alive);
            for (int i = 0; i < n; i++)
                if (pids[i] > 0) kill(pids[i], sig);
            if (!kill_at && sig != SIGUSR1 && sig != SIGUSR2) kill_at = now_s() + o->grace_s + 5;
        }
        for (int i = 0; i < n; i++) {
            if (pids[i] <= 0) continue;
            int st;
            pid_t r = waitpid(pids[i], &st, WNOHANG);
            if (r != pids[i]) continue;
            pids[i] = -1;
            alive--;
            codes[i] = exit_code_of(st);
            if (codes[i] != 0 && !rc) rc = codes[i];
            if (codes[i] != 0 && !stopping) {
                stopping = 1;
                for (int k = 0; k < n; k++)
                    if (pids[k] > 0) kill(pids[k], SIGTERM);
                kill_at = now_s() + o->grace_s + 5;
            }
        }
        if (kill_at && now_s() > kill_at) {
            for (int i = 0; i < n; i++)
                if (pids[i] > 0) kill(-pids[i], SIGKILL), kill(pids[i], SIGKILL);
            kill_at = 0;
        }
        if (alive > 0) sleep_ms(20);
    }
    free(pids);
    free(codes);
    if (rc != 0) {
        worker_status s;
        if (first_failure(p, base, p->local_world_size, &s) >= 0) {
            if (!first_signal) report_failure(o, &s);
            rc = s.code;
        } else {
            if (!first_signal) fprintf(stderr, "shardlm launch: a worker failed with code %d\n", rc);
        }
    }
    return rc;
}

// Runs mpirun / srun and supervises it. Returns the group's exit code.
static int run_external_group(const launch_opts *o, const launch_plan *p, char **cmd) {
    fflush(stdout);
    fflush(stderr);
    pid_t launcher = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        reset_signals_to_default();
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
        while ((sig = take_pending_signal()) != 0) {
            // srun treats one SIGINT as "report status"; SIGTERM is what it forwards to the tasks
            int fwd = (p->backend == BACKEND_SRUN && sig == SIGINT) ? SIGTERM : sig;
            fprintf(stderr, "shardlm launch: received %s, forwarding to %s\n", signal_name(sig), backend_name[p->backend]);
            kill(pid, fwd);
        }
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) break;
        sleep_ms(20);
    }
    int rc = exit_code_of(st);
    if (rc == 0) return 0;
    worker_status s;
    if (first_failure(p, 0, p->world_size, &s) >= 0) {
        if (!first_signal) report_failure(o, &s);
        return s.code;
    }
    fprintf(stderr, "shardlm launch: %s exited with code %d (no worker status found in %s; see %s's messages above)\n",
            backend_name[p->backend], rc, p->status_dir, backend_name[p->backend]);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// --print-sbatch

static void print_sbatch(const launch_opts *o, const launch_plan *p) {
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
    if (o->log_dir[0]) { printf("export SHARDLM_LOG_DIR="); print_quoted(stdout, o->log_dir); printf("\nmkdir -p \"$SHARDLM_LOG_DIR\"\n"); }
    printf("\n# one task per rank; each detects its rank from SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID\n");
    printf("srun --kill-on-bad-exit=1 --cpus-per-task=$SLURM_CPUS_PER_TASK");
    if (o->log_dir[0]) { printf(" --output="); print_quoted(stdout, o->log_dir); printf("/rank_%%t.log"); }
    for (int i = 0; i < p->prog_argc; i++) {
        printf(" ");
        print_quoted(stdout, p->prog_argv[i]);
    }
    printf("\n");
}

// ---------------------------------------------------------------------------------------------
// entry points

// Worker mode: one mpirun / srun rank's wrapper.
static int launch_as_worker(const launch_opts *o, int argc, char **argv) {
    const char *rank_s = getenv("OMPI_COMM_WORLD_RANK");
    if (!rank_s) rank_s = getenv("SLURM_PROCID");
    if (!rank_s) rank_s = getenv("PMI_RANK");
    if (!rank_s) rank_s = getenv("SHARDLM_RANK");
    int rank = rank_s ? atoi(rank_s) : 0;
    if (o->devices[0]) {  // "0,1@3": host h owns the next (its slot count) ranks
        int start = 0;
        const char *spec = o->devices;
        for (;;) {
            const char *at = strchr(spec, '@');
            size_t len = at ? (size_t)(at - spec) : strlen(spec);
            int count = 1;
            for (size_t i = 0; i < len; i++) count += spec[i] == ',';
            if (rank < start + count || !at) {
                char devs[LAUNCH_PATH_MAX];
                snprintf(devs, sizeof devs, "%.*s", (int)len, spec);
                setenv("CUDA_VISIBLE_DEVICES", devs, 1);
                break;
            }
            start += count;
            spec = at + 1;
        }
    }
    const char *restart = getenv("SHARDLM_RESTART_COUNT");
    worker_spec w = {.rank = rank, .log_dir = o->log_dir[0] ? o->log_dir : NULL, .tee = o->tee,
                     .status_dir = o->status_dir[0] ? o->status_dir : NULL, .grace_s = o->grace_s,
                     .hang_timeout_s = o->hang_timeout_s, .append = restart && atoi(restart) > 0, .argv = argv + o->prog};
    (void)argc;
    // mpirun's or srun's death (its parent here) reaches this wrapper as SIGTERM: it stops its program
    install_forwarding();
    if (sl_die_with_parent(SIGTERM, getppid()) != 0 || getppid() == 1) return 128 + SIGTERM;
    return worker_run(&w);
}

static int launch_attempts(const launch_opts *o, launch_plan *p) {
    int rc = 0;
    for (int attempt = 0; attempt <= o->max_restarts; attempt++) {
        if (attempt > 0) fprintf(stderr, "shardlm launch: restarting (attempt %d of %d)\n", attempt, o->max_restarts);
        set_common_env(o, p, attempt);
        clear_status(p->status_dir, p->world_size);
        if (p->backend == BACKEND_FORK) {
            rc = run_fork_group(o, p, attempt);
        } else {
            argv_list cmd = {0};
            if ((p->backend == BACKEND_MPIRUN ? build_mpirun(&cmd, o, p) : build_srun(&cmd, o, p)) != 0) {
                av_free(&cmd);
                fprintf(stderr, "error: %s\n", sl_error());
                return 1;
            }
            rc = run_external_group(o, p, cmd.v);
            av_free(&cmd);
        }
        if (first_signal) {
            if (rc == 0) rc = 128 + first_signal;  // the ranks exited cleanly, but the run was interrupted
            fprintf(stderr, "shardlm launch: stopped by %s (exit code %d)\n", signal_name(first_signal), rc);
            break;
        }
        if (rc == 0) break;
    }
    clear_status(p->status_dir, p->world_size);
    return rc;
}

int cmd_launch(int argc, char **argv) {
    launch_opts *o = calloc(1, sizeof *o);
    if (!o) { fprintf(stderr, "error: out of memory\n"); return 1; }
    int prc = parse_launch_flags(argc, argv, o);
    if (prc != 0) { free(o); return prc > 0 ? 0 : 2; }
    if (o->as_worker) {
        int rc = launch_as_worker(o, argc, argv);
        free(o);
        return rc;
    }
    launch_plan p;
    if (resolve_plan(o, argc, argv, &p) != 0) {
        fprintf(stderr, "error: %s\n", sl_error());
        plan_free(&p);
        free(o);
        return 2;
    }
    int rc = 0;
    if (o->print_sbatch) {
        print_sbatch(o, &p);
    } else if (o->dry_run) {
        set_common_env(o, &p, 0);
        snprintf(p.status_dir, sizeof p.status_dir, "%s", o->log_dir[0] ? o->log_dir : "/tmp/shardlm_launch_XXXXXX");
        print_plan(stdout, o, &p);
        if (p.backend == BACKEND_FORK) {
            char devices[LAUNCH_PATH_MAX] = "";
            if (p.deepspeed_devices) sl_host_slots_string(&p.pool.hosts[0], devices, sizeof devices);
            for (int i = 0; i < p.local_world_size; i++) {
                int rank = p.node_rank * p.local_world_size + i;
                printf("rank %d: MASTER_ADDR=%s MASTER_PORT=%d RANK=%d WORLD_SIZE=%d LOCAL_RANK=%d LOCAL_WORLD_SIZE=%d%s%s ",
                       rank, p.master_addr, p.master_port, rank, p.world_size, i, p.local_world_size,
                       devices[0] ? " CUDA_VISIBLE_DEVICES=" : "", devices);
                print_argv(stdout, p.prog_argv);
            }
        } else {
            argv_list cmd = {0};
            if ((p.backend == BACKEND_MPIRUN ? build_mpirun(&cmd, o, &p) : build_srun(&cmd, o, &p)) != 0) {
                fprintf(stderr, "error: %s\n", sl_error());
                rc = 2;
            } else {
                if (p.backend == BACKEND_SRUN)
                    for (int i = 0; common_env_names[i]; i++)
                        if (getenv(common_env_names[i])) printf("%s=%s ", common_env_names[i], getenv(common_env_names[i]));
                print_argv(stdout, cmd.v);
            }
            av_free(&cmd);
        }
    } else {
        if (o->log_dir[0]) {
            if (mkdir_p(o->log_dir) != 0) { fprintf(stderr, "error: --log-dir: %s\n", sl_error()); rc = 2; }
            snprintf(p.status_dir, sizeof p.status_dir, "%s", o->log_dir);
        } else {
            snprintf(p.status_dir, sizeof p.status_dir, "/tmp/shardlm_launch_XXXXXX");
            if (!mkdtemp(p.status_dir)) { fprintf(stderr, "error: cannot create a temporary directory: %s\n", strerror(errno)); rc = 2; }
            else p.status_dir_is_temp = 1;
        }
        if (rc == 0) {
            install_forwarding();
            rc = launch_attempts(o, &p);
        }
        if (p.status_dir_is_temp) rmdir(p.status_dir);
    }
    plan_free(&p);
    free(o);
    return rc;
}
