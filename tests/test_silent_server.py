"""A peer that accepts connections and never answers (a hung process, a port taken by
something else): every call ends within its timeout (plus a small margin), and calls
without one within the client's silence bound (10 s) with UnavailableError saying why."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import reverb

SILENCE = 10.0


@pytest.fixture
def silent_address():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.settimeout(0.1)
    held = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        listener.close()
        for conn in held:
            conn.close()


def _timed(call) -> tuple:
    started = time.monotonic()
    try:
        call()
        error = None
    except Exception as e:  # noqa: BLE001 - the test inspects it
        error = e
    return time.monotonic() - started, error


def test_calls_with_a_timeout_end_at_it(silent_address) -> None:
    client = reverb.Client(silent_address)
    calls = {
        "server_info": lambda: client.server_info(timeout=1),
        "sample": lambda: next(client.sample("t", timeout=1)),
        "insert": lambda: client.insert(np.int32(1), {"t": 1.0}, timeout=1),
        "mutate_priorities": lambda: client.mutate_priorities("t", {1: 1.0}, timeout=1),
        "reset": lambda: client.reset("t", timeout=1),
        "checkpoint": lambda: client.checkpoint(timeout=1),
    }
    with ThreadPoolExecutor(len(calls)) as pool:
        results = dict(zip(calls, pool.map(_timed, calls.values())))
    for name, (took, error) in results.items():
        assert isinstance(error, reverb.errors.DeadlineExceededError), (name, error)
        assert took < 2.5, (name, took)


@pytest.mark.slow
def test_iterators_with_a_rate_limiter_timeout_end_soon_after_it(silent_address) -> None:
    it = reverb.TrajectoryIterator(silent_address, "t", rate_limiter_timeout_ms=1000)
    took, error = _timed(lambda: next(it))
    assert isinstance(error, StopIteration), error
    assert took < 6, took


@pytest.mark.slow
def test_calls_without_a_timeout_end_at_the_silence_bound(silent_address) -> None:
    client = reverb.Client(silent_address)

    def writer_item() -> None:
        writer = reverb.Client(silent_address).trajectory_writer(1)
        writer.append({"x": np.int32(1)})
        writer.create_item("t", 1.0, writer.history["x"][-1:])

    calls = {
        "server_info": client.server_info,
        "create_item": writer_item,
    }
    with ThreadPoolExecutor(len(calls)) as pool:
        results = dict(zip(calls, pool.map(_timed, calls.values())))
    for name, (took, error) in results.items():
        assert isinstance(error, reverb.errors.UnavailableError), (name, error)
        assert "sent nothing" in str(error), (name, error)
        assert SILENCE - 0.5 < took < SILENCE + 3, (name, took)
