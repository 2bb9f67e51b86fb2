"""`reverb inspect`: a checkpoint read without a server (settings, counters, priority and
times-sampled histograms, episodes, a plot), and live servers, ours and dm-reverb's."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import _reference as reference
import numpy as np
import pytest

import reverb
from reverb import cli

T = 10.0


def _checkpoint(root: pathlib.Path) -> str:
    table = reverb.Table(
        "replay",
        reverb.selectors.Prioritized(0.6),
        reverb.selectors.Fifo(),
        100,
        reverb.rate_limiters.MinSize(1),
    )
    server = reverb.Server(
        [table, reverb.Table.queue("queue", 10)],
        checkpointer=reverb.checkpointers.DefaultCheckpointer(str(root)),
    )
    client = server.localhost_client()
    with client.trajectory_writer(2) as w:
        for _ in range(4):
            for t in range(6):
                w.append({"x": np.float32(t)})
                if t >= 1:
                    w.create_item("replay", float(t), {"x": w.history["x"][-2:]})
            w.end_episode(timeout_ms=int(T * 1000))
    list(client.sample("replay", 9, emit_timesteps=False, timeout=T))
    path = client.checkpoint(timeout=T)
    server.stop()
    return path


def test_inspect_a_checkpoint(tmp_path: pathlib.Path, capsys) -> None:
    path = _checkpoint(tmp_path)
    assert cli.main(["inspect", path, "--bins", "5"]) == 0
    out = capsys.readouterr().out
    assert "table 'replay': 20 items of at most 100" in out
    assert "sampler Prioritized(0.6), remover Fifo, max_times_sampled 0" in out
    assert "inserts 20, samples 9, deletes 0" in out
    assert "episodes: 4 with items here" in out
    # Priorities 1..5, four of each: min 1, mean 3, max 5; five bins of four.
    assert "priority: min 1  mean 3  max 5" in out
    full_bars = re.findall(rf"\)\s+4\s+#{{{cli.BAR}}}$", out, re.M)
    assert len(full_bars) == 5, out
    assert "times sampled: min 0" in out
    assert "table 'queue': 0 items of at most 10" in out
    # One table only, from the checkpointer's root (its latest checkpoint).
    assert cli.main(["inspect", str(tmp_path), "--table", "queue"]) == 0
    out = capsys.readouterr().out
    assert "'queue'" in out and "'replay'" not in out


def test_inspect_plots_the_histograms(tmp_path: pathlib.Path, capsys) -> None:
    pytest.importorskip("matplotlib")
    path = _checkpoint(tmp_path / "ckpt")
    png = tmp_path / "replay.png"
    assert cli.main(["inspect", path, "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_inspect_a_live_server_and_bad_targets(tmp_path: pathlib.Path, capsys) -> None:
    server = reverb.Server([reverb.Table.queue("q", 5)])
    try:
        server.localhost_client().insert([np.int64(1)], {"q": 1.0}, timeout=T)
        assert cli.main(["inspect", f"localhost:{server.port}"]) == 0
        out = capsys.readouterr().out
        assert "table 'q': 1 items of at most 5" in out and "inserts 1, samples 0" in out
    finally:
        server.stop()
    bad = tmp_path / "bad.rvb"
    bad.write_bytes(b"not a checkpoint")
    assert cli.main(["inspect", str(bad)]) == 1
    assert "corrupt checkpoint" in capsys.readouterr().err
    # A mistyped path is not taken for an address; an unknown table is named.
    assert cli.main(["inspect", str(tmp_path / "typo")]) == 1
    assert "no such checkpoint, nor a host:port" in capsys.readouterr().err
    path = _checkpoint(tmp_path / "ckpt")
    assert cli.main(["inspect", path, "--table", "nope"]) == 1
    assert "no table 'nope'" in capsys.readouterr().err


def test_the_reverb_command_is_installed_with_the_package(tmp_path: pathlib.Path) -> None:
    """`python -m reverb.cli` always; the `reverb` console script where the package is
    installed (the wheel CI tests)."""
    path = _checkpoint(tmp_path)
    commands = [[sys.executable, "-m", "reverb.cli"]]
    script = pathlib.Path(sys.executable).with_name("reverb")
    if script.exists():
        commands.append([str(script)])
    for command in commands:
        run = subprocess.run(
            [*command, "inspect", path], capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0, run.stderr
        assert "table 'replay': 20 items" in run.stdout


@pytest.mark.skipif(not reference.PYTHON, reason="REVERB_REFERENCE_PYTHON is not set")
def test_inspect_a_dm_reverb_server(capsys) -> None:
    then = 'reverb.Client(f"localhost:{server.port}").insert([np.int64(3)], {"dm": 1.0})'
    with reference.server('[reverb.Table.queue("dm", 7)]', then) as port:
        assert cli.main(["inspect", f"localhost:{port}"]) == 0
        out = capsys.readouterr().out
        assert "table 'dm': 1 items of at most 7" in out
        assert "sampler Fifo, remover Fifo, max_times_sampled 1" in out
