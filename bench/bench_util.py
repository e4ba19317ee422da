"""bench_util.py: what the benchmark scripts share. Standard library only; the scripts run as
`python3 bench/NAME.py`, so this directory is on their import path."""
import json
import os
import platform
import subprocess
import time


def machine_busy_seconds():
    """CPU seconds the machine spent busy (user, nice, system, irq, softirq, steal) since boot, from
    /proc/stat; None when unreadable."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def replace_section(path, begin, end, section):
    """Puts `section` (which starts with `begin` and ends with `end`) into the Markdown file at `path` in
    place of the text between the two markers, or appends it when they are missing; the rest of the
    file is kept. Written to PATH.tmp, then renamed."""
    try:
        with open(path) as f:
            old = f.read()
    except FileNotFoundError:
        old = ""
    if begin in old and end in old:
        new = old[:old.index(begin)] + section.rstrip("\n") + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + "\n\n" + section
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(new if new.endswith("\n") else new + "\n")
    os.replace(tmp, path)


def step_times_ms(times):
    """ms_per_step (the mean), ms_per_step_min and ms_per_step_median of per-step times in seconds."""
    st = sorted(times)
    n = len(st)
    median = st[n // 2] if n % 2 else 0.5 * (st[n // 2 - 1] + st[n // 2])
    return {"ms_per_step": round(1e3 * sum(st) / n, 3), "ms_per_step_min": round(1e3 * st[0], 3),
            "ms_per_step_median": round(1e3 * median, 3)}


def read_jsonl(path):
    """The JSON objects of a results file, one a line; other lines (blank, text) are skipped."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip().startswith("{")]


def _sh(command):
    """A shell command's output, stripped; "?" when it cannot run."""
    try:
        return subprocess.run(command, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def machine_record(commit, **fields):
    """The first line of a results file: {"meta": 1}, the date, `commit`, the machine (CPU model, cores,
    memory, OS and kernel, compiler, Debian's OpenBLAS and oneDNN packages) and the load average, then
    `fields` (the run's settings)."""
    record = {"meta": 1, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "commit": commit,
              "cpu": _sh("lscpu | sed -n 's/^Model name:[ \\t]*//p' | head -1"), "cores": os.cpu_count(),
              "mem": _sh("free -h | awk '/^Mem:/{print $2}'"),
              "os": _sh(". /etc/os-release && echo $PRETTY_NAME") + ", kernel " + platform.release(),
              "gcc": _sh("${CC:-gcc} --version | head -1"),
              "openblas_pkg": _sh("dpkg-query -W -f='${Version}' libopenblas0-openmp 2>/dev/null") or "?",
              "onednn_pkg": _sh("dpkg-query -W -f='${Version}' libdnnl2 2>/dev/null") or "?"}
    record.update(fields)
    with open("/proc/loadavg") as f:
        record["load_before"] = " ".join(f.read().split()[:3])
    return record
