"""Runs the PyTorch adapter's tests in a virtualenv with torch (`REVERB_TORCH_PYTHON`, which
`scripts/test` prepares), loading this checkout's package and built libraries through
PYTHONPATH. The main test environment has no torch: its wheels with CUDA are gigabytes."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_torch_adapter_tests_pass_under_pytorch(rerun_under) -> None:
    _, result = rerun_under(
        "REVERB_TORCH_PYTHON",
        "import torch, pytest, pytest_timeout; print(torch.__version__)",
        ["tests/test_torch_dataset.py"],
        probe_timeout=300,
    )
    assert "skipped" not in result.stdout, result.stdout
