"""The reference (dm-reverb 0.14, with TensorFlow 2.15) for the tests that compare with it:
its interpreter, when REVERB_REFERENCE_PYTHON names one, run on scripts, and its servers in
processes of their own.

Everything runs from "/" and without PYTHONPATH: from a checkout of ours, `python -c` puts
the working directory first on the path, and `import reverb` would find our package instead
of dm-reverb's."""

from __future__ import annotations

import contextlib
import os
import subprocess
import textwrap
from typing import Iterator

PYTHON = os.environ.get("REVERB_REFERENCE_PYTHON")
#: The environment for runs of TensorFlow programs: without its log lines and warnings.
QUIET = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
# The reference's runs also leave out PYTHONPATH, which may name our package.
_ENV = {k: v for k, v in QUIET.items() if k != "PYTHONPATH"}


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs the reference's interpreter with `args` (`"-c", source`, or a script's path and
    its arguments) and asserts it succeeded."""
    assert PYTHON, "REVERB_REFERENCE_PYTHON is not set"
    out = subprocess.run(
        [PYTHON, *args], capture_output=True, text=True, timeout=timeout, env=_ENV, cwd="/"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


@contextlib.contextmanager
def server(tables: str, then: str = "") -> Iterator[int]:
    """A dm-reverb server of `tables` (source of a list of `reverb.Table`, run there with
    `np` and `reverb` imported) in its own process, after `then` ran (source, with `server`
    bound); yields its port and kills it on exit."""
    assert PYTHON, "REVERB_REFERENCE_PYTHON is not set"
    script = "\n".join(
        [
            "import sys, numpy as np, reverb",
            f"server = reverb.Server({tables})",
            textwrap.dedent(then),
            "print(server.port, flush=True)",
            "sys.stdin.read()",
        ]
    )
    proc = subprocess.Popen(
        [PYTHON, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_ENV,
        cwd="/",
    )
    try:
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.communicate(timeout=10)  # also closes the pipes
