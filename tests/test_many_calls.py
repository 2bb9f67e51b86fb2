"""Thousands of short calls on one connection to a server in another process keep working
(driving gRPC calls from the caller's thread once failed after a few thousand with HTTP/2
ENHANCE_YOUR_CALM)."""

from __future__ import annotations

import pathlib
import threading
import time

import numpy as np
import pytest
from _metrics import scrape, waiting
from _standalone import start, stop
from _wait import wait_for

import reverb

CALLS = 20000


@pytest.mark.slow
def test_thousands_of_samples_and_priority_updates_on_one_connection(
    tmp_path: pathlib.Path,
) -> None:
    config = {
        "port": 0,
        "tables": [{"name": "t", "sampler": "uniform", "remover": "fifo", "max_size": 100}],
    }
    proc, port, lines = start(config, tmp_path)
    try:
        client = reverb.Client(f"localhost:{port}")
        client.insert(np.arange(4, dtype=np.float32), {"t": 1.0})
        for i in range(CALLS):
            sample = next(client.sample("t", 1, emit_timesteps=False))
            if i % 20 == 0:
                client.mutate_priorities("t", {sample.info.key: 1.0 + i}, timeout=10)
        assert sample.data[0].tolist() == [[0.0, 1.0, 2.0, 3.0]]
        assert client.server_info(timeout=10)["t"].current_size == 1
    finally:
        stop(proc, lines)


def _open_sample_streams(metrics_port: int) -> float:
    return scrape(metrics_port)['reverb_streams{kind="sample"}']


def test_sample_calls_reuse_open_streams_and_drop_timed_out_ones(monkeypatch) -> None:
    """One-shot `Client.sample` calls over gRPC keep their stream open for the next call (one
    round trip each); a call that timed out with its request still waiting on the server
    drops its stream, so that request can never take an item meant for a later call."""
    monkeypatch.setenv("REVERB_NO_INPROC", "1")
    server = reverb.Server(
        [
            reverb.Table(
                "u",
                sampler=reverb.selectors.Uniform(),
                remover=reverb.selectors.Fifo(),
                max_size=10,
                rate_limiter=reverb.rate_limiters.MinSize(1),
            ),
            reverb.Table.queue("q", 10),
        ],
        metrics_port=0,
    )
    try:
        client = reverb.Client(f"localhost:{server.port}")
        client.insert(np.float32(1.5), {"u": 1.0}, timeout=10)
        for _ in range(200):
            assert next(client.sample("u", 1, emit_timesteps=False, timeout=10)).data[0] == 1.5
        assert _open_sample_streams(server.metrics_port) == 1

        # Concurrent calls each take a stream of their own; at most a few stay open.
        def sample_many() -> None:
            for _ in range(100):
                next(client.sample("u", 1, emit_timesteps=False, timeout=10))

        threads = [threading.Thread(target=sample_many) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert 1 <= _open_sample_streams(server.metrics_port) <= 4

        with pytest.raises(reverb.errors.DeadlineExceededError):
            next(client.sample("q", 1, timeout=0.3))
        for value in (7, 8):
            client.insert(np.int32(value), {"q": 1.0}, timeout=10)
            got = next(client.sample("q", 1, emit_timesteps=False, timeout=10)).data[0]
            assert got == value
        # No request of the timed-out call is left waiting to take the next item: none waits
        # on the server now, and none arrives there later (a time, for a negative).
        wait_for(lambda: waiting(server.metrics_port, "q", "sample") == 0, 10, "no sample to wait")
        client.insert(np.int32(9), {"q": 1.0}, timeout=10)
        time.sleep(0.3)
        assert client.server_info(timeout=10)["q"].current_size == 1
    finally:
        server.stop()


def test_sample_after_the_server_restarted_on_its_port(monkeypatch) -> None:
    """A kept sample stream whose server stopped is not used again: the next call waits for
    the server that took its place."""
    monkeypatch.setenv("REVERB_NO_INPROC", "1")

    def table() -> reverb.Table:
        return reverb.Table(
            "u",
            sampler=reverb.selectors.Uniform(),
            remover=reverb.selectors.Fifo(),
            max_size=10,
            rate_limiter=reverb.rate_limiters.MinSize(1),
        )

    server = reverb.Server([table()])
    port = server.port
    client = reverb.Client(f"localhost:{port}")
    try:
        client.insert(np.float32(1.0), {"u": 1.0}, timeout=10)
        for _ in range(3):
            assert next(client.sample("u", 1, emit_timesteps=False, timeout=10)).data[0] == 1.0
    finally:
        server.stop()
    restarted = {}

    def restart() -> None:
        # A time: the sample below must be made while no server is up.
        time.sleep(0.5)
        restarted["server"] = reverb.Server([table()], port=port)
        reverb.Client(f"localhost:{port}").insert(np.float32(2.0), {"u": 1.0}, timeout=10)

    thread = threading.Thread(target=restart)
    thread.start()
    try:
        got = next(client.sample("u", 1, emit_timesteps=False, timeout=20)).data[0]
        assert got == 2.0
    finally:
        thread.join(timeout=30)
        if "server" in restarted:
            restarted["server"].stop()
