// launch_worker.c: the worker wrapper, the small supervisor around one rank's program. It starts the
// program in its own process group, writes its output to LOGDIR/rank_N.log (and, with --tee, to the
// terminal prefixed "[rank N] ", a line per write so ranks never interleave mid-line), forwards
// signals to the whole group (SIGKILL after the grace period), kills it when its heartbeat stops
// (--hang-timeout), and records how it ended in the rank's status file (launch_status.c). With
// --backend fork the launcher forks the wrappers; with mpirun / srun every rank runs this binary as
// `shardlm launch --as-worker ...`. Invariant: a wrapper returns only after its program has been
// reaped and whatever it left in its process group has been killed.
#include "cli/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

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
    if (n == 0) { launch_sleep_ms(timeout_ms); return; }
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

int launch_worker_run(const worker_spec *w) {
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    int log_fd = -1;
    if (w->log_dir) {
        char path[DERIVED_PATH_MAX];
        snprintf(path, sizeof path, "%s/rank_%d.log", w->log_dir, w->rank);
        if (launch_mkdir_p(w->log_dir) == 0)
            log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | (w->append ? 0 : O_TRUNC) | O_CLOEXEC, 0644);
        if (log_fd < 0) {
            fprintf(stderr, "shardlm launch: rank %d: cannot open log %s: %s\n", w->rank, path, strerror(errno));
            launch_write_status(w->status_dir, w->rank, host, 127, 0, 0, NULL);
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
    launch_forwarded_sigset(&block);
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
        launch_reset_signals();
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
    launch_install_forwarding();
    sigprocmask(SIG_SETMASK, &old, NULL);

    int wstatus = 0, stopped = 0, hung = 0;
    double kill_at = 0;
    for (;;) {
        int sig;
        while ((sig = launch_take_pending_signal()) != 0) {
            kill(-pid, sig);
            if (sig != SIGUSR1 && sig != SIGUSR2 && !stopped) {
                stopped = 1;
                kill_at = launch_now_s() + w->grace_s;
            }
        }
        pid_t r = waitpid(pid, &wstatus, WNOHANG);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) { wstatus = 127 << 8; break; }
        if (!stopped && !hung && sl_hang_watch_tripped(&hang, w->rank, host, launch_now_s())) {
            kill(-pid, SIGKILL);  // a stopped or stuck process cannot act on SIGTERM
            hung = 1;
        }
        if (stopped && kill_at > 0 && launch_now_s() >= kill_at) {
            fprintf(stderr, "shardlm launch: rank %d did not stop within %d s; sending SIGKILL\n", w->rank, w->grace_s);
            kill(-pid, SIGKILL);
            kill_at = 0;
        }
        pump_tee(ts, nts, log_fd, w->rank, 50);
    }
    kill(-pid, SIGKILL);  // whatever the program left behind in its process group
    double drain_until = launch_now_s() + 2.0;
    for (;;) {
        int open_pipes = 0;
        for (int i = 0; i < nts; i++) open_pipes += ts[i].fd >= 0;
        if (!open_pipes || launch_now_s() > drain_until) break;
        pump_tee(ts, nts, log_fd, w->rank, 100);
    }
    for (int i = 0; i < nts; i++) {
        if (ts[i].fd >= 0) close(ts[i].fd);
        tee_finish(&ts[i]);
    }
    if (log_fd >= 0) close(log_fd);
    int code = hung ? SL_HUNG_EXIT_CODE : launch_exit_code_of(wstatus);
    launch_write_status(w->status_dir, w->rank, host, code, hung || !WIFSIGNALED(wstatus) ? 0 : WTERMSIG(wstatus), stopped, hung ? &hang : NULL);
    return code;
}

// Worker mode: one mpirun / srun rank's wrapper.
int launch_as_worker(const launch_opts *o, char **argv) {
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
    // mpirun's or srun's death (its parent here) reaches this wrapper as SIGTERM: it stops its program
    launch_install_forwarding();
    if (sl_die_with_parent(SIGTERM, getppid()) != 0 || getppid() == 1) return 128 + SIGTERM;
    return launch_worker_run(&w);
}
