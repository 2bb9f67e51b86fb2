"""Runs the PyTorch adapter's tests in a virtualenv with torch (`REVERB_TORCH_PYTHON`, which
`scripts/test` prepares), loading this checkout's package and built libraries through
PYTHONPATH. The main test environment has no torch: its wheels with CUDA are gigabytes."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_torch_adapter_tests_pass_under_pytorch() -> None:
    python = os.environ.get("REVERB_TORCH_PYTHON")
    if not python:
        pytest.skip("REVERB_TORCH_PYTHON (a virtualenv with torch) is not set")
    probe = "import torch, pytest, pytest_timeout; print(torch.__version__)"
    version = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300)
    if version.returncode != 0:
        pytest.skip(f"{python} lacks torch, pytest or pytest-timeout")
    result = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_torch_dataset.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout
