"""The hand-kept type stubs of the extension (`reverb/_native.pyi`) match the built module:
every class, method, argument name and kind (mypy's stubtest)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_native_stubs_match_the_built_module(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("mypy")
    config = tmp_path / "mypy.ini"
    # Only the stub is checked: imported modules are read for their types, not reported on.
    config.write_text("[mypy]\nfollow_imports = silent\nignore_missing_imports = True\n")
    root = pathlib.Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy.stubtest",
            "reverb._native",
            "--mypy-config-file",
            str(config),
            # (pyo3 classes are PEP 800 disjoint bases; the stub need not say so.)
            "--ignore-disjoint-bases",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        # mypy does not follow editable installs' import hooks: point it at the package.
        env={**os.environ, "MYPYPATH": str(root)},
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_the_package_version_is_the_crates_version() -> None:
    import importlib.metadata

    import reverb

    # Declared once, in Cargo.toml (setup.py hands it to the package metadata).
    assert importlib.metadata.version("dm-reverb") == reverb.__version__
