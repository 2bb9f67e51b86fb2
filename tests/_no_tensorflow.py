"""Runs a script in a fresh Python where TensorFlow cannot be imported, for tests."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_BLOCK = """
import sys

class BlockTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ImportError("tensorflow is blocked for this test")
        return None

sys.meta_path.insert(0, BlockTensorFlow())
"""


def run_without_tensorflow(body: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Runs `body` (dedented) after blocking every TensorFlow import."""
    script = _BLOCK + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout
    )
