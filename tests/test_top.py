"""`reverb top`: the live view, in a real terminal (tmux), follows a writer: the table's size
and insert rate move between two captures of the pane; `--once` prints one frame; the
metrics parser reads our endpoint."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request

import _reference as reference
import numpy as np
import pytest
from _wait import wait_for

import reverb
from reverb import cli, top

pytest.importorskip("rich")


def _server() -> reverb.Server:
    table = reverb.Table(
        "replay",
        reverb.selectors.Uniform(),
        reverb.selectors.Fifo(),
        100_000,
        reverb.rate_limiters.MinSize(10),
    )
    return reverb.Server([table], metrics_port=0)


def test_metrics_are_parsed_from_our_endpoint() -> None:
    server = _server()
    try:
        server.localhost_client().insert([np.int64(1)], {"replay": 1.0}, timeout=10)
        url = f"http://localhost:{server.metrics_port}/metrics"
        metrics = top.parse_metrics(urllib.request.urlopen(url, timeout=10).read().decode())
        assert metrics[("reverb_table_size", (("table", "replay"),))] == 1
        # Fewer items than min_size_to_sample: sampling is blocked, and says why.
        labels = (("call", "sample"), ("reason", "too_few_items"), ("table", "replay"))
        assert metrics[("reverb_table_blocked", labels)] == 1
    finally:
        server.stop()


def test_once_prints_one_frame_with_rates(capsys) -> None:
    server = _server()
    stop = threading.Event()

    def write() -> None:
        client = server.localhost_client()
        i = 0
        while not stop.is_set():
            client.insert([np.int64(i)], {"replay": 1.0}, timeout=10)
            i += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        address = f"localhost:{server.port}"
        args = ["top", address, "--metrics-port", str(server.metrics_port), "--once"]
        assert cli.main([*args, "--interval", "0.5"]) == 0
    finally:
        stop.set()
        writer.join(10)
        server.stop()
    out = capsys.readouterr().out
    [row] = [line for line in out.splitlines() if "replay" in line and "/100,000" in line]
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[0] == "replay" and int(cells[2].replace(",", "")) > 0  # inserts per second
    assert "streams:" in out and "chunks:" in out
    assert cli.main(["top", "localhost:1", "--once", "--interval", "0.1"]) == 1


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_the_live_view_follows_a_writer_in_a_terminal(tmp_path: pathlib.Path) -> None:
    server = _server()
    session = f"reverb-top-{server.port}"
    stop = threading.Event()
    inserted = [0]

    def write() -> None:
        client = server.localhost_client()
        while not stop.is_set():
            client.insert([np.int64(inserted[0])], {"replay": 1.0}, timeout=10)
            inserted[0] += 1
            time.sleep(0.002)

    # From the directory holding the package under test (the checkout, or site-packages).
    home = pathlib.Path(reverb.__file__).resolve().parent.parent
    # (Without COLUMNS/LINES, which pytest may set: the view takes the pane's size.)
    command = (
        f"env -u COLUMNS -u LINES {sys.executable} -m reverb.cli top localhost:{server.port} "
        f"--metrics-port {server.metrics_port} --interval 0.5"
    )
    tmux = ["tmux", "-L", session]
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", session, "-x", "160", "-y", "30", "-c", str(home)]
        + [command],
        check=True,
        timeout=30,
    )
    writer = threading.Thread(target=write)
    try:

        def pane() -> str:
            return subprocess.run(
                [*tmux, "capture-pane", "-p", "-t", session],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout

        def size_shown() -> int:
            found = re.search(r"replay\s*│\s*([\d,]+)/100,000", pane())
            return int(found.group(1).replace(",", "")) if found else -1

        try:
            wait_for(lambda: size_shown() == 0, 60, "the view to show the empty table")
        except AssertionError:
            raise AssertionError(f"the pane shows:\n{pane()}") from None
        writer.start()
        wait_for(lambda: size_shown() > 50, 60, "the view to show the writer's items")
        first = size_shown()
        wait_for(lambda: size_shown() > first, 30, "the size to move on")
        screen = pane()
        row = next(line for line in screen.splitlines() if "replay" in line and "│" in line)
        cells = [c.strip() for c in row.strip("│ ").split("│")]
        assert int(cells[2].replace(",", "")) > 0, screen  # inserts per second
        assert "streams:" in screen
    finally:
        stop.set()
        if writer.is_alive():
            writer.join(10)
        subprocess.run([*tmux, "kill-server"], timeout=30)
        server.stop()


@pytest.mark.slow
@pytest.mark.skipif(not reference.PYTHON, reason="REVERB_REFERENCE_PYTHON is not set")
def test_once_against_a_dm_reverb_server(capsys) -> None:
    then = 'reverb.Client(f"localhost:{server.port}").insert([np.int64(3)], {"dm": 1.0})'
    with reference.server('[reverb.Table.queue("dm", 7)]', then) as port:
        assert cli.main(["top", f"localhost:{port}", "--once", "--interval", "0.2"]) == 0
        out = capsys.readouterr().out
        assert re.search(r"│ dm\s+│\s+1/7 │", out), out
        assert "no metrics endpoint" in out
