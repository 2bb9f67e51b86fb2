"""A seconds-long smoke run of the benchmark workloads (the benchmark is a tool, not a test:
this only keeps it working)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

WORKLOADS = pathlib.Path(__file__).resolve().parent.parent / "bench" / "workloads.py"


def _has_tensorflow() -> bool:
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        return False
    return True


SMOKED = ["writer_small", "writer_frames", "writer_vector", "legacy_writer", "actors2"]
SMOKED += ["client_sample", "prioritized", "append_only", "import_time"]
NEEDS_TF = ["dataset_small", "dataset_setup", "structured_small"]


@pytest.fixture(scope="module")
def smoke_results() -> dict:
    """Every smoked workload's report, from one run of bench/workloads.py (one process:
    each workload in a process of its own would import TensorFlow again)."""
    names = SMOKED + (NEEDS_TF if _has_tensorflow() else [])
    out = subprocess.run(
        [sys.executable, str(WORKLOADS), ",".join(names), "inproc", "0.2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    reports = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {r["workload"]: r for r in reports}


@pytest.mark.slow
@pytest.mark.parametrize(
    "workload",
    SMOKED
    + [
        pytest.param(w, marks=pytest.mark.skipif(not _has_tensorflow(), reason="needs TensorFlow"))
        for w in NEEDS_TF
    ],
)
def test_workload_runs_and_reports(workload: str, smoke_results: dict) -> None:
    result = smoke_results[workload]
    assert result["workload"] == workload and result["value"] > 0


@pytest.mark.slow
def test_sharded_benchmark_runs_at_small_scale() -> None:
    """bench/sharded.py with two shards for half a second (as root it makes network
    namespaces; the machines this runs on allow that)."""
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    script = WORKLOADS.parent / "sharded.py"
    out = subprocess.run(
        [sys.executable, str(script), "--seconds", "0.5", "--shards", "2"]
        + ["--item-kib", "8", "--distribution-samples", "2000"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| 2 |" in out.stdout and "prioritized" in out.stdout and "Global" in out.stdout


@pytest.mark.slow
@pytest.mark.skipif(not _has_tensorflow(), reason="the server's table signature needs TensorFlow")
def test_scale_benchmark_runs_at_small_scale() -> None:
    """bench/scale.py filling a table to two small levels with one actor."""
    script = WORKLOADS.parent / "scale.py"
    out = subprocess.run(
        [sys.executable, str(script), "--levels", "1500,3000", "--slice", "500"]
        + ["--actors", "1", "--seconds", "0.3", "--tables", "prioritized"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["items"] for r in rows] == [1500, 3000]
    for r in rows:
        assert min(r["insert_items_per_s"], r["base_insert_items_per_s"]) > 0
        assert min(r["samples_per_s"], r["base_samples_per_s"]) > 0
    assert "| prioritized | 3,000 |" in out.stdout


def test_chart_draws_the_newest_run_only(tmp_path) -> None:
    sys.path.insert(0, str(WORKLOADS.parent))
    try:
        import chart
    finally:
        sys.path.remove(str(WORKLOADS.parent))
    results = tmp_path / "RESULTS.md"
    results.write_text(
        "## Newest\n"
        "| workload | server | ours | reference | ratio |\n"
        "|---|---|---|---|---|\n"
        "| writer_small | same process | 10 steps/s | 2 steps/s | 5.0x |\n"
        "| legacy_writer | other process | 6 steps/s | 2 steps/s | 3.0x |\n"
        "\n"
        "## Older\n"
        "| writer_small | same process | 8 steps/s | 2 steps/s | 4.0x |\n"
        "| client_sample | same process | 6 steps/s | 2 steps/s | 3.0x |\n"
    )
    assert chart.read_rows(str(results)) == [
        ("writer_small (same proc.)", 5.0),
        ("legacy_writer (other proc.)", 3.0),
    ]


@pytest.mark.parametrize("system", ["ours", "ours-remote"])
def test_peers_benchmark_runs_ours(system: str) -> None:
    """One short measurement of ours in `bench/peers.py` (the peers need their own
    virtualenvs: not here), with the server here and in another process."""
    peers = WORKLOADS.parent / "peers.py"
    out = subprocess.run(
        [sys.executable, str(peers), "run", system, "sample_small", "0.2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["system"] == system and report["value"] > 0
