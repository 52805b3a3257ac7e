"""A private CUDA MPS daemon for one launch (`python -m deploy.launch --mps`, issue 28).

Without MPS, two processes on one GPU take turns: the GPU time-slices their contexts, so a prefill
worker's long kernels and a decode worker's steps never run at once. Under an MPS daemon their kernels
run side by side on the SMs (the issue's own measurement on one H200, 8B shape: 1 prefill + 1 decode
0.88x aggregated time-sliced, 0.97x under MPS). This is the two-process alternative to the one-GPU
multiplexed worker (deploy/plan.py, common/multiplex), which shares weights and the KV pool in one
process; under MPS each worker keeps its own weights and the KV moves over CUDA IPC as usual.

Invariants:
* Private: the daemon's pipe and log directories live under the launch's own temporary directory
  (`CUDA_MPS_PIPE_DIRECTORY`, `CUDA_MPS_LOG_DIRECTORY`), so it never meets a system-wide daemon or
  another launch's, and only processes given `worker_env()` connect to it. No GPU setting (compute
  mode included) is changed.
* Order: started before any worker creates a CUDA context (a context made before the daemon runs
  stays outside it), stopped (`quit`) after every worker has exited, also when start-up fails.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"
CONTROL_TIMEOUT_S = 30.0
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"


class MPSDaemon:
    """One control daemon with its directories under `root`; `start` runs it, `stop` ends it."""

    def __init__(self, root: str | Path, control: str = CONTROL) -> None:
        self.root = Path(root)
        self.control = control
        self._exe: str | None = None  # the control program's path while the daemon runs

    @property
    def pipe_dir(self) -> Path:
        return self.root / "pipe"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    def worker_env(self) -> dict[str, str]:
        """What a worker's environment needs so that its CUDA context goes through this daemon."""
        return {PIPE_ENV: str(self.pipe_dir), LOG_ENV: str(self.log_dir)}

    def start(self) -> None:
        """Start the daemon (`-d` returns once it runs); RuntimeError, with its log, when it cannot."""
        exe = shutil.which(self.control)
        if exe is None:
            raise RuntimeError(f"--mps needs {self.control} on PATH (CUDA's MPS control program)")
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        done = self._control(exe, ["-d"], None)
        if done.returncode != 0:
            raise RuntimeError(f"the MPS daemon did not start (exit {done.returncode}): {self._said(done)}")
        self._exe = exe
        log.info("MPS daemon started (pipe directory %s)", self.pipe_dir)

    def stop(self) -> None:
        """Ask the daemon to quit (it ends its server once no client is left); idempotent."""
        exe, self._exe = self._exe, None
        if exe is None:
            return
        try:
            done = self._control(exe, [], "quit\n")
        except (OSError, subprocess.TimeoutExpired) as e:
            log.error("could not stop the MPS daemon: %s", e)
            return
        if done.returncode != 0:
            log.error("the MPS daemon did not quit (exit %d): %s", done.returncode, self._said(done))

    def _control(self, exe: str, args: list[str], stdin: str | None) -> subprocess.CompletedProcess:
        env = dict(os.environ, **self.worker_env())
        return subprocess.run(
            [exe, *args], input=stdin, env=env, capture_output=True, text=True, timeout=CONTROL_TIMEOUT_S
        )

    def _said(self, done: subprocess.CompletedProcess) -> str:
        """What the control program printed, else the end of the daemon's own log."""
        text = (done.stderr or done.stdout or "").strip()
        control_log = self.log_dir / "control.log"
        if not text and control_log.is_file():
            text = control_log.read_text(errors="replace")[-2000:].strip()
        return text or "no output"
