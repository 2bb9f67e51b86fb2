"""A peer that accepts connections and never answers (a hung process, a port taken by
something else): every call ends within its timeout (plus a small margin), and calls
without one within the client's silence bound (10 s) with UnavailableError saying why."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import reverb

SILENCE = 10.0


@contextlib.contextmanager
def _listening(on_accept):
    """A localhost listener whose thread hands each connection to `on_accept(conn, stop)`,
    which returns the sockets to close at the end; yields its address."""
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
            held.extend(on_accept(conn, stop))

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


@pytest.fixture
def silent_address():
    with _listening(lambda conn, stop: [conn]) as address:
        yield address


def _timed(call) -> tuple:
    started = time.monotonic()
    try:
        call()
        error = None
    except Exception as e:  # noqa: BLE001 - the test inspects it
        error = e
    return time.monotonic() - started, error


def test_a_validating_writer_waits_no_longer_than_its_calls_timeouts(silent_address) -> None:
    """The first item of a table needs the table's signature: create_item does not wait the
    silence bound for it (the item is checked when it comes), and flush's timeout covers the
    wait."""
    writer = reverb.Client(silent_address).trajectory_writer(1)
    writer.append({"x": np.int32(1)})
    took, error = _timed(lambda: writer.create_item("t", 1.0, writer.history["x"][-1:]))
    assert error is None and took < 1.5, (took, error)
    cpu = time.process_time()
    took, error = _timed(lambda: writer.flush(timeout_ms=2000))
    assert isinstance(error, reverb.errors.DeadlineExceededError), error
    assert 1.9 < took < 3, took
    # It waited for the signatures, not spun (this process's CPU time over the 2 s).
    assert time.process_time() - cpu < 0.5
    writer.append({"x": np.int32(2)})
    took, error = _timed(lambda: writer.create_item("t", 1.0, writer.history["x"][-1:]))
    assert error is None and took < 0.5, (took, error)
    took, error = _timed(lambda: writer.end_episode(timeout_ms=1000))
    assert isinstance(error, reverb.errors.DeadlineExceededError), error
    assert 0.9 < took < 2, took


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
        # The item waits for the table's signature in the background; flush waits for it.
        writer.create_item("t", 1.0, writer.history["x"][-1:])
        writer.flush()

    calls = {
        "server_info": client.server_info,
        "create_item and flush": writer_item,
    }
    with ThreadPoolExecutor(len(calls)) as pool:
        results = dict(zip(calls, pool.map(_timed, calls.values())))
    for name, (took, error) in results.items():
        assert isinstance(error, reverb.errors.UnavailableError), (name, error)
        assert "sent nothing" in str(error), (name, error)
        assert SILENCE - 0.5 < took < SILENCE + 3, (name, took)


@pytest.fixture
def slow_server(make_server):
    """A server behind a proxy that holds each connection's first answer back 1.5 s (past the
    writer's wait for the tables), then forwards everything at once."""
    tf = pytest.importorskip("tensorflow")
    server = make_server(
        [
            reverb.Table.queue("t", 10, signature={"x": tf.TensorSpec([1], tf.int32)}),
        ]
    )

    def pipe(src: socket.socket, dst: socket.socket, delay: float, stop) -> None:
        try:
            while not stop.is_set():
                data = src.recv(65536)
                if not data:
                    break
                if delay:
                    time.sleep(delay)
                    delay = 0.0
                dst.sendall(data)
        except OSError:
            pass

    def forward(conn: socket.socket, stop) -> list:
        upstream = socket.create_connection(("127.0.0.1", server.port))
        threading.Thread(target=pipe, args=(conn, upstream, 0.0, stop), daemon=True).start()
        threading.Thread(target=pipe, args=(upstream, conn, 1.5, stop), daemon=True).start()
        return [conn, upstream]

    with _listening(forward) as address:
        yield server, address


def test_items_made_before_the_signature_came_are_checked_before_they_are_sent(
    slow_server,
) -> None:
    server, address = slow_server
    writer = reverb.Client(address).trajectory_writer(1)
    writer.append({"x": np.int32(1)})
    # Fits the signature (int32[1]).
    took, error = _timed(lambda: writer.create_item("t", 1.0, writer.history["x"][-1:]))
    assert error is None and took < 1.2, (took, error)
    # Does not (a squeezed int32 scalar): refused when the signature comes, never sent.
    writer.create_item("t", 1.0, writer.history["x"][-1])
    writer.append({"x": np.int32(2)})
    writer.create_item("t", 1.0, writer.history["x"][-1:])
    with pytest.raises(ValueError, match="signature"):
        writer.flush(timeout_ms=10_000)
    writer.flush(timeout_ms=10_000)
    samples = server.localhost_client().sample("t", 2, emit_timesteps=False, timeout=5)
    got = [s.data[0].tolist() for s in samples]
    assert got == [[1], [2]]
    assert server.localhost_client().server_info()["t"].current_size == 0


def test_a_refusal_found_later_is_reported_before_the_next_call_changes_anything(
    slow_server,
) -> None:
    """A deferred item refused while a later create_item sends the queue: that create_item
    succeeds (its own item is stored once), the next call reports the refusal."""
    server, address = slow_server
    writer = reverb.Client(address).trajectory_writer(1)
    writer.append({"x": np.int32(1)})
    writer.create_item("t", 1.0, writer.history["x"][-1:])
    writer.create_item("t", 1.0, writer.history["x"][-1])  # refused: squeezed
    time.sleep(2.0)  # the signatures have come by now
    writer.append({"x": np.int32(2)})
    writer.create_item("t", 1.0, writer.history["x"][-1:])
    with pytest.raises(ValueError, match="signature"):
        writer.flush(timeout_ms=10_000)
    writer.flush(timeout_ms=10_000)
    samples = server.localhost_client().sample("t", 2, emit_timesteps=False, timeout=5)
    assert [s.data[0].tolist() for s in samples] == [[1], [2]]
    assert server.localhost_client().server_info()["t"].current_size == 0


def _structured_writer(address: str, *patterns) -> reverb.StructuredWriter:
    """A structured writer of steps `{"x": int32}` with a config per pattern (a function of
    the reference step) into table "t"."""
    from reverb import structured_writer as sw

    configs = [sw.create_config(sw.pattern_from_transform({"x": None}, p), "t") for p in patterns]
    return reverb.Client(address).structured_writer(configs)


def test_a_structured_writer_waits_no_longer_than_its_calls_timeouts(silent_address) -> None:
    """The configs' tables and signatures come from the server: appends do not wait the
    silence bound for them (items are checked when they come), flush's timeout covers it."""
    writer = _structured_writer(silent_address, lambda step: step["x"][-1:])
    took, error = _timed(lambda: writer.append({"x": np.int32(1)}))
    assert error is None and took < 1.5, (took, error)
    took, error = _timed(lambda: writer.append({"x": np.int32(2)}))
    assert error is None and took < 0.5, (took, error)
    cpu = time.process_time()
    took, error = _timed(lambda: writer.flush(timeout_ms=2000))
    assert isinstance(error, reverb.errors.DeadlineExceededError), error
    assert 1.9 < took < 3, took
    assert time.process_time() - cpu < 0.5  # it waited, not spun
    took, error = _timed(lambda: writer.end_episode(timeout_ms=1000))
    assert isinstance(error, reverb.errors.DeadlineExceededError), error
    assert 0.9 < took < 2, took


def test_structured_items_made_before_the_signature_came_are_checked_before_they_are_sent(
    slow_server,
) -> None:
    server, address = slow_server
    # The first config's items fit the signature (int32[1]); the second's (a squeezed
    # scalar) do not: refused when the signature comes, never sent.
    writer = _structured_writer(address, lambda s: s["x"][-1:], lambda s: s["x"][-1])
    took, error = _timed(lambda: writer.append({"x": np.int32(1)}))
    assert error is None and took < 1.2, (took, error)
    with pytest.raises(ValueError, match="signature"):
        writer.flush(timeout_ms=10_000)
    # Once the signature is known, the second config is refused when it applies.
    with pytest.raises(ValueError, match="signature"):
        writer.append({"x": np.int32(2)})
    writer.flush(timeout_ms=10_000)
    samples = server.localhost_client().sample("t", 2, emit_timesteps=False, timeout=5)
    assert [s.data[0].tolist() for s in samples] == [[1], [2]]
    assert server.localhost_client().server_info()["t"].current_size == 0
