"""benchmarks/engine/chunk_start_trace.py: its reading of a profiler trace, and its run end to end."""

from __future__ import annotations

import pytest

from benchmarks.engine import chunk_start_trace as cst


def _kernel(name: str, ts: float, dur: float, stream: int, correlation: int) -> dict:
    return {
        "cat": "kernel",
        "name": name,
        "ts": ts,
        "dur": dur,
        "args": {"stream": stream, "correlation": correlation},
    }


def _trace() -> dict:
    """Three decode steps on stream 7 (two kernels each, 10 ms apart); a chunk's lane kernels on stream 9
    start inside the second step and run through the third; a runtime event is ignored."""
    events = [
        {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0, "dur": 5, "args": {"correlation": 1}}
    ]
    for step in range(3):
        t = step * 10_000.0
        slow = 2.0 if step == 1 else 1.0  # the step beside the chunk's start runs its GEMM twice as long
        events += [
            _kernel("gemm", t, 4_000 * slow, 7, step),
            _kernel("attn", t + 4_000 * slow, 1_000, 7, step),
        ]
    events += [_kernel("prefill_gemm", 12_000 + i * 3_000, 2_500, 9, 100) for i in range(6)]
    return {"traceEvents": events}


def test_decode_steps_are_graph_launches_on_the_busiest_stream_with_the_lane_time_inside_them():
    steps = cst.decode_steps(cst.kernel_events(_trace()))
    assert [round(s.span_ms, 3) for s in steps] == [5.0, 9.0, 5.0]
    assert [s.chunk_start for s in steps] == [False, True, False]
    # lane kernels 12-14.5, 15-17.5, 18-20.5 ms overlap step 1 (10-19 ms) by 2.5 + 2.5 + 1.0 ms
    assert steps[1].lane_us == pytest.approx(6_000.0)
    assert steps[0].lane_us == 0.0 and steps[2].lane_us == pytest.approx(4_000.0)  # 20-20.5, 21-23.5, 24-25
    assert steps[1].lane_kernels == {"prefill_gemm": pytest.approx(6_000.0)}


def test_the_report_names_the_kernels_that_slow_down_at_a_chunk_start(capsys):
    cst.report(cst.decode_steps(cst.kernel_events(_trace())))
    out = capsys.readouterr().out
    assert "chunk start      1 steps, span p50 9.00 ms" in out
    decode, lane = out.split("top 10 by growth")[1:]
    assert decode.splitlines()[1].split() == ["8000.0", "4000.0", "gemm"]
    assert lane.splitlines()[1].split() == ["6000.0", "4000.0", "prefill_gemm"]


def test_a_run_on_the_cpu_records_steps_and_finds_no_device_kernels(tiny_model_dirs, tmp_path, capsys):
    argv = ["--model", tiny_model_dirs["qwen3"], "--device", "cpu", "--streams", "2", "--long-prompt", "48"]
    argv += [
        "--long-count",
        "2",
        "--chunks",
        "32",
        "--max-model-len",
        "512",
        "--steps",
        "4",
        "--arm",
        "30:sync",
    ]
    assert cst.main([*argv, "--out", str(tmp_path)]) == []
    assert (tmp_path / "chunk_start_trace.json.gz").stat().st_size > 0
    assert "no device kernels" in capsys.readouterr().out


@pytest.mark.gpu
def test_on_the_gpu_the_decode_steps_and_a_chunk_start_are_found(tiny_model_dirs):
    argv = [
        "--model",
        tiny_model_dirs["qwen3"],
        "--streams",
        "4",
        "--long-prompt",
        "256",
        "--long-count",
        "2",
    ]
    argv += ["--chunks", "256", "--max-model-len", "1024", "--steps", "12", "--arm", "30:sync"]
    steps = cst.main(argv)
    assert len(steps) >= 8 and any(s.chunk_start for s in steps)
