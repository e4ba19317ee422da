#!/usr/bin/env python3
"""finetune_run.py: runs one fine-tuning command of bench/finetune.sh and measures it from outside, the
same way for shardlm and PyTorch; prints one JSON line. Standard library only.

  finetune_run.py --impl shardlm|pytorch --mode full|lora|dora|qlora --arch gpt2|llama --warmup W --steps S
                  --batch B --seq T --threads N [--round R] [--metrics FILE] [--log FILE] -- COMMAND...

The command must print a line starting with "step K/" after each training step (shardlm train with
--log-interval 1 on a pipe; bench/torch_finetune.py), flushed. Measured here:

- Peak resident memory. `peak_rss_bytes`: the largest resident set of the whole process, start to exit
  (what /usr/bin/time -v calls "Maximum resident set size"). `train_peak_rss_bytes`: the largest
  resident set from the end of the first step to exit: the steady state of training, without loading
  and conversion. How: when the first "step" line arrives, VmHWM (/proc/PID/status, the kernel's
  high-water mark) is read, then reset to the current resident set by writing 5 to /proc/PID/clear_refs;
  at exit, os.wait4 gives ru_maxrss, which is that same high-water mark (since the reset). So
  train_peak = ru_maxrss and peak = max(VmHWM before the reset, ru_maxrss). Without a step line
  (a failed run) peak = ru_maxrss and there is no train_peak.
- The timed window: from the line of step W to the line of step W+S (both sides print it right after a
  step ends). other_load = (machine busy CPU seconds in that window, /proc/stat) - (the child's CPU
  seconds in it, /proc/PID/stat utime + stime, all threads)) / window seconds: how many cores' worth
  of CPU something else used while the timed steps ran.

Step times: PyTorch's JSON line (bench/torch_finetune.py times each step itself, from its batch to
after the optimizer step); for shardlm, train's metrics file (--metrics FILE): elapsed_s of step k
minus that of step k-1 is the time of step k, so the mean over k = W+1 .. W+S is
(elapsed[W+S] - elapsed[W]) / S. A failed command gives {"status": "failed", "rc", "error"} with the
last "error:" line of its output (what the renderer shows)."""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

from bench_util import machine_busy_seconds, read_jsonl, step_times_ms


def process_cpu_seconds(pid):
    """utime + stime of a live process (all its threads), from /proc/PID/stat; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def status_kib(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", required=True, choices=["shardlm", "pytorch"])
    ap.add_argument("--mode", required=True, choices=["full", "lora", "dora", "qlora"])
    ap.add_argument("--arch", required=True)
    ap.add_argument("--warmup", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--round", type=int, default=1)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--metrics", help="shardlm train's --metrics file")
    ap.add_argument("--log", help="append the command's stdout and stderr here")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if not cmd:
        sys.exit("finetune_run: no command after --")
    if a.warmup < 1 or a.steps < 1:
        sys.exit("finetune_run: --warmup and --steps must be at least 1 (the first step's end starts the steady state)")
    if a.metrics and os.path.exists(a.metrics):
        os.remove(a.metrics)
    log = open(a.log, "a") if a.log else open(os.devnull, "w")
    log.write(f"== {a.impl} {a.mode} {a.arch} {a.precision} round {a.round} {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(cmd)}\n")
    log.flush()
    load_before = open("/proc/loadavg").read().split()[:3]
    t_start = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    err_lines = []

    def drain_stderr():
        for line in p.stderr:
            err_lines.append(line)
            log.write(line)
    t_err = threading.Thread(target=drain_stderr, daemon=True)
    t_err.start()

    out_lines, hwm_before_kib, marks = [], None, {}
    first_w, last_w = a.warmup, a.warmup + a.steps
    for line in p.stdout:
        out_lines.append(line)
        log.write(line)
        if not line.startswith("step "):
            continue
        try:
            k = int(line.split()[1].split("/")[0])
        except (IndexError, ValueError):
            continue
        if hwm_before_kib is None:
            hwm_before_kib = status_kib(p.pid, "VmHWM")
            try:
                with open(f"/proc/{p.pid}/clear_refs", "w") as f:
                    f.write("5")
            except OSError as e:
                log.write(f"finetune_run: cannot reset the peak resident set ({e}): train_peak is the whole run's\n")
        if k in (first_w, last_w) and k not in marks:
            marks[k] = (time.perf_counter(), machine_busy_seconds(), process_cpu_seconds(p.pid))
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    t_err.join()
    wall = time.perf_counter() - t_start
    log.flush()
    rss = ru.ru_maxrss * 1024  # Linux: kilobytes
    common = {"impl": a.impl, "mode": a.mode, "arch": a.arch, "precision": a.precision, "B": a.batch, "T": a.seq, "threads": a.threads,
              "round": a.round, "wall_s": round(wall, 2), "load_before": " ".join(load_before),
              "load_after": " ".join(open("/proc/loadavg").read().split()[:3]), "rc": p.returncode}
    peak = max(rss, (hwm_before_kib or 0) * 1024)
    common.update({"peak_rss_bytes": peak, "load_peak_rss_bytes": (hwm_before_kib or 0) * 1024 or None,
                   "train_peak_rss_bytes": rss if hwm_before_kib is not None else None})
    w0, w1 = marks.get(first_w), marks.get(last_w)
    if w0 and w1 and None not in (w0[2], w1[2]) and w1[0] > w0[0]:
        common["other_load"] = round(max(0.0, (w1[1] - w0[1] - (w1[2] - w0[2])) / (w1[0] - w0[0])), 2)
        common["own_cpu_util"] = round((w1[2] - w0[2]) / (w1[0] - w0[0]), 2)

    def failed(why):
        errs = [l.strip() for l in err_lines + out_lines if l.strip().lower().startswith("error")]
        common.update({"status": "failed", "error": errs[-1] if errs else why})
        print(json.dumps(common), flush=True)
        sys.exit(0)

    if p.returncode != 0:
        failed(f"exit status {p.returncode}")
    if a.impl == "pytorch":
        js = [l for l in out_lines if l.startswith("{")]
        if not js:
            failed("no JSON line in the output")
        r = json.loads(js[-1])
        r["inner_other_load"] = r.pop("other_load", None)
        r.update(common)
    else:
        rows = []
        try:
            rows = read_jsonl(a.metrics)
        except (OSError, ValueError, TypeError) as e:
            failed(f"metrics file {a.metrics}: {e}")
        el = {r["step"]: r["elapsed_s"] for r in rows if "elapsed_s" in r}
        if last_w not in el or (first_w > 0 and first_w not in el):
            failed(f"metrics file {a.metrics} lacks steps {first_w} and {last_w}")
        times = [el[k] - el.get(k - 1, 0.0) for k in range(first_w + 1, last_w + 1)]
        mean = (el[last_w] - el.get(first_w, 0.0)) / a.steps
        losses = [r["loss"] for r in sorted(rows, key=lambda r: r["step"]) if "loss" in r]
        r = {"steps": a.steps, "warmup": a.warmup, **step_times_ms(times), "tokens_per_s": round(a.batch * a.seq / mean, 2), "first_loss": round(losses[0], 5),
             "losses": [round(v, 5) for v in losses]}
        for line in out_lines:  # what train says about the model, memory and CPU
            s = line.strip()
            if s.startswith("model:"):
                r["model_line"] = s
            elif s.startswith("memory"):
                r["memory_line"] = s
            elif s.startswith("cpu:"):
                r["cpu_line"] = s
        r.update(common)
    r["status"] = "ok"
    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
