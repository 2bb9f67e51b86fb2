"""Standalone servers (`python -m reverb.server_main`) in a child process, for tests."""

from __future__ import annotations

import json
import pathlib
import re
import signal
import subprocess
import sys
import time


def start(config: object, tmp_path: pathlib.Path) -> tuple:
    """Starts a server from `config` (a dict, written as a JSON file, or the `--config`
    argument itself); returns (process, port, stderr lines so far)."""
    if isinstance(config, dict):
        path = tmp_path / "config.json"
        path.write_text(json.dumps(config))
        config = str(path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "reverb.server_main", "--config", str(config)],
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        assert line, f"server exited early: {''.join(lines)}"
        lines.append(line)
        match = re.search(r"serving on port (\d+)", line)
        if match:
            return proc, int(match.group(1)), lines
    proc.kill()
    raise AssertionError("server did not start")


def stop(proc: subprocess.Popen, lines: list) -> str:
    """Stops it with SIGTERM (it must exit cleanly); returns its whole stderr."""
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=30)
    assert proc.returncode == 0, rest
    return "".join(lines) + rest
