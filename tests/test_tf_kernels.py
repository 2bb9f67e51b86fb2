"""The kernel library works with every supported TensorFlow: it may only use TF_* symbols that
all of them export (crates/reverb-tf-ops/tf_symbols.txt), and the TF tests pass under
TensorFlow 2.15 too."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reverb import _tf_ops

ROOT = Path(__file__).resolve().parent.parent
ALLOW_LIST = ROOT / "crates" / "reverb-tf-ops" / "tf_symbols.txt"

needs_nm = pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils)")


def _allow_list() -> set:
    lines = (line.strip() for line in ALLOW_LIST.read_text().splitlines())
    return {line for line in lines if line and not line.startswith("#")}


def _symbols(library: str, which: str) -> set:
    out = subprocess.run(
        ["nm", "-D", f"--{which}-only", library], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def _framework_library(python: str) -> str:
    """libtensorflow_framework.so.2 of the TensorFlow that `python` imports."""
    code = "import os, tensorflow as tf; print(os.path.dirname(tf.__file__))"
    out = subprocess.run(
        [python, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    if out.returncode != 0:
        pytest.skip(f"{python} cannot import tensorflow")
    return os.path.join(out.stdout.strip().splitlines()[-1], "libtensorflow_framework.so.2")


def _pythons() -> list:
    pythons = [sys.executable]
    if os.environ.get("REVERB_REFERENCE_PYTHON"):
        pythons.append(os.environ["REVERB_REFERENCE_PYTHON"])  # TensorFlow 2.15
    return pythons


@needs_nm
def test_kernel_library_uses_only_allow_listed_tf_symbols() -> None:
    used = {s for s in _symbols(_tf_ops.library_path(), "undefined") if s.startswith("TF_")}
    assert used, "the library should use the TF C API"
    assert used <= _allow_list(), f"not in tf_symbols.txt: {sorted(used - _allow_list())}"


def test_kernel_library_needs_the_framework_library_by_soname() -> None:
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("needs readelf (binutils)")
    out = subprocess.run(
        [readelf, "-d", _tf_ops.library_path()], capture_output=True, text=True, check=True
    ).stdout
    assert "[libtensorflow_framework.so.2]" in out


@pytest.mark.slow
@needs_nm
@pytest.mark.parametrize("python", _pythons())
def test_every_allow_listed_symbol_is_exported_by_tensorflow(python: str) -> None:
    exported = _symbols(_framework_library(python), "defined")
    missing = _allow_list() - exported
    assert not missing, f"{python}'s TensorFlow does not export {sorted(missing)}"


@pytest.mark.slow
def test_tf_tests_pass_under_tensorflow_2_15(rerun_under) -> None:
    """Runs the dataset and TFClient tests with the reference's virtualenv (TF 2.15.1), loading
    this checkout (same built libraries) through PYTHONPATH."""
    version, _ = rerun_under(
        "REVERB_REFERENCE_PYTHON",
        "import tensorflow as tf, pytest, pytest_timeout; print(tf.__version__)",
        ["tests/test_tf_dataset.py", "tests/test_tf_client.py", "tests/test_pattern_dataset.py"],
        probe_timeout=120,
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    assert version.strip().splitlines()[-1].startswith("2.15")
