"""benchmarks/serving/worker_host.py end to end at tiny sizes: the offline engine and a real mixed worker
(WorkerService, I/O thread, ZMQ) against the driver process, with every phase in the table."""

from __future__ import annotations

import json

import pytest

from benchmarks.serving import worker_host

pytestmark = pytest.mark.timeout(180)


def test_a_tiny_run_reports_every_phase(tmp_path, capsys) -> None:
    out = tmp_path / "result.json"
    argv = ["--num-requests", "24", "--concurrency", "8", "--prompt-len", "32", "--output-len", "8"]
    argv += ["--vocab-size", "512", "--repeats", "1", "--json", str(out)]
    result = worker_host.main(argv)
    table = capsys.readouterr().out
    for phase in (
        "engine host",
        "schedule",
        "take_commands",
        "make_sequence",
        "on_step",
        "after_iteration",
        "events.flush",
        "post_load",
        "I/O thread (or process) CPU",
        "io decode",
        "io encode",
        "total host",
    ):
        assert phase in table, phase
    worker, offline = result["summary"]["worker"], result["summary"]["offline"]
    assert worker["requests finished"]["median"] == 24  # the driver got every request's end
    assert worker["steps"]["median"] > 0 and offline["steps"]["median"] > 0
    assert worker["cpu io"]["median"] > 0 and worker["on_step"]["median"] > 0
    assert worker["total host"]["median"] >= worker["engine host"]["median"]
    assert json.loads(out.read_text())["summary"].keys() == {"offline", "worker"}


def test_bad_arguments_are_refused() -> None:
    for bad in (["--concurrency", "0"], ["--num-requests", "-1"], ["--repeats", "0"]):
        with pytest.raises(SystemExit):
            worker_host.parse_args(bad)


def test_both_worker_io_arms_serve_every_request() -> None:
    argv = ["--num-requests", "24", "--concurrency", "8", "--prompt-len", "32", "--output-len", "8"]
    argv += ["--vocab-size", "512", "--repeats", "1", "--worker-io", "thread", "process"]
    summary = worker_host.main(argv)["summary"]
    assert summary.keys() == {"offline", "worker thread", "worker process"}
    for arm in ("worker thread", "worker process"):
        assert summary[arm]["requests finished"]["median"] == 24, arm
        assert summary[arm]["steps"]["median"] > 0, arm
