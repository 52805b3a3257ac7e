"""Router front processes for benchmarks/serving/router_throughput.py, started as deploy/fronts.py
starts them: front 0 binds a free port, the others join it; with more than one, each binds with
SO_REUSEPORT (`--reuse-port`) and is told its index (`--front`), and each has its own ZMQ inbox (the
workers register with all of them and answer each request to the inbox named in its `reply_to`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

TTFT_METRIC = "pdserve_time_to_first_token_seconds"


def cpu_list(text: str) -> list[int]:
    """`0`, `0-7` or `0,2,4-6` as a list of CPU numbers (argparse type)."""
    cpus: list[int] = []
    try:
        for part in text.split(","):
            low, _, high = part.partition("-")
            cpus += range(int(low), int(high or low) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected CPUs like 0, 0-7 or 0,2,4-6, got {text!r}") from None
    if not cpus or min(cpus) < 0:
        raise argparse.ArgumentTypeError(f"expected CPUs like 0, 0-7 or 0,2,4-6, got {text!r}")
    return cpus


class RouterFronts:
    def __init__(self, model: str, state_dir: Path, extra: list[str], cpus: list[int] | None) -> None:
        self.model, self.dir, self.extra, self.cpus = model, state_dir, extra, cpus
        self.procs: list[subprocess.Popen] = []
        self.ready: list[dict] = []

    @property
    def url(self) -> str:
        """Every front's URL: they share one port."""
        return self.ready[0]["http"]

    @property
    def inboxes(self) -> list[str]:
        return [r["inbox"] for r in self.ready]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def other_cpus(self) -> set[int] | None:
        """The CPUs left to workers and clients when the fronts are pinned (None: no pinning)."""
        if not self.cpus:
            return None
        return (os.sched_getaffinity(0) - set(self.cpus[: len(self.procs)])) or None

    def start(self, n: int) -> None:
        port = 0
        for index in range(n):
            self._spawn(index, port, several=n > 1)
            port = int(self.ready[0]["http"].rsplit(":", 1)[1])  # the others join front 0's port

    def _spawn(self, index: int, port: int, several: bool) -> None:
        ready = self.dir / f"router-{index}-ready.json"
        argv = [sys.executable, "-m", "router", "--model", self.model, "--port", str(port)]
        argv += ["--ready-file", str(ready), "--log-level", "warning", "--max-running-requests", "100000"]
        if several:
            argv += ["--front", str(index), "--reuse-port"]
        proc = subprocess.Popen([*argv, *self.extra], stdout=subprocess.DEVNULL, preexec_fn=self._pin(index))
        self.procs.append(proc)
        deadline = time.time() + 60
        while not ready.exists():
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"router front {index} did not start")
            time.sleep(0.05)
        self.ready.append(json.loads(ready.read_text()))

    def _pin(self, index: int):
        """What pins front `index` to its CPU in the child (None: not pinned)."""
        cpu = None if not self.cpus else self.cpus[index % len(self.cpus)]
        return None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))

    def cpu_seconds(self) -> list[float]:
        return cpu_seconds(self.pids)

    def ttft_totals(self) -> tuple[float, int] | None:
        """The fronts' own time to first token so far, summed over them (/metrics answers for all):
        (seconds, requests). It runs from a sequence's arrival stamp (its request parsed, validated and
        planned) to its first token taken in the request's task, so the client's TTFT less this is the
        HTTP intake, the admission work and the response write."""
        with urllib.request.urlopen(f"{self.url}/metrics") as r:
            text = r.read().decode()
        total, count = 0.0, 0
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name.startswith(TTFT_METRIC + "_sum"):
                total += float(value)
            elif name.startswith(TTFT_METRIC + "_count"):
                count += int(float(value))
        return total, count

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def cpu_seconds(pids: list[int]) -> list[float]:
    """User + system CPU seconds of each process so far (0 for one that has exited)."""
    out = []
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            out.append(0.0)
            continue
        out.append((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    return out


def wait_healthy(url: str, fronts: int, workers: int) -> None:
    """Until every front has every worker registered. The fronts share the port, so each poll is a new
    connection that the kernel hands to one of them; /health says which (its `front`)."""
    deadline = time.time() + 60
    ready: set[int | None] = set()
    while len(ready) < fronts:
        if time.time() > deadline:
            raise RuntimeError(f"workers registered with {len(ready)} of {fronts} fronts")
        try:
            with urllib.request.urlopen(f"{url}/health") as r:
                health = json.loads(r.read())
            if len(health["workers"]) == workers:
                ready.add(health.get("front"))
                continue
        except OSError:
            pass
        time.sleep(0.05)


def start_profiler(out: str | None, pid: int, duration: float) -> subprocess.Popen | None:
    """py-spy on one front for the measured window: a flame graph SVG, speedscope .json or
    collapsed stacks .txt."""
    if out is None:
        return None
    fmt = {".json": "speedscope", ".txt": "raw"}.get(Path(out).suffix, "flamegraph")
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    extra = os.environ.get("PYSPY_ARGS", "").split()  # e.g. "--native -r 200"
    argv = [exe, "record", *extra, "--pid", str(pid), "--duration", str(int(duration)), "-o", out, "-f", fmt]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL)
