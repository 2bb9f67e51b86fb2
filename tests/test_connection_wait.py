"""Calls made before their server is up wait for it (as the reference's do): until their
timeout (then DeadlineExceededError), or without one for REVERB_CONNECT_WAIT_SECONDS (then
UnavailableError). Actors and learners are routinely started before the replay server."""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable, Dict, List

import numpy as np
import pytest

import reverb

LATER = 1.0  # the server starts this long after the call


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _tables() -> List[reverb.Table]:
    return [reverb.Table.queue("q", 100)]


class _LateServer:
    """A server started on `port` `LATER` seconds from now, in another thread."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.server = None
        self._thread = threading.Thread(target=self._start, daemon=True)
        self._thread.start()

    def _start(self) -> None:
        time.sleep(LATER)  # a time: the point of the tests, a server that is not up yet
        self.server = reverb.Server(_tables(), port=self.port)

    def stop(self) -> None:
        self._thread.join(timeout=30)
        if self.server is not None:
            self.server.stop()


@pytest.fixture
def late_server():
    started = _LateServer(_free_port())
    yield started
    started.stop()


@pytest.fixture
def tf():
    """TensorFlow, imported before a late server's clock starts (the first import in a
    process takes seconds: the server would be up before the call)."""
    return pytest.importorskip("tensorflow")


def _one_item(address: str) -> None:
    reverb.Client(address).insert(np.float32(7.0), {"q": 1.0}, timeout=10)


def _writer_flush(address: str) -> None:
    writer = reverb.Client(address).trajectory_writer(1)
    writer.append({"x": np.float32(7.0)})
    writer.create_item("q", 1.0, {"x": writer.history["x"][-1]})
    writer.flush(timeout_ms=10_000)
    writer.close()


def _sample(address: str) -> None:
    client = reverb.Client(address)
    # A time, pacing: the item comes once the server is up and the call waits on its empty
    # table (its insert would wait for the server too; an item sooner would pass as well).
    feeder = threading.Thread(target=lambda: (time.sleep(LATER + 0.5), _one_item(address)))
    feeder.start()
    [sample] = list(client.sample("q", 1, timeout=10))
    feeder.join()
    assert float(sample[0].data[0]) == 7.0


def _iterator(address: str) -> None:
    # A time, pacing (as in `_sample`).
    feeder = threading.Thread(target=lambda: (time.sleep(LATER + 0.5), _one_item(address)))
    feeder.start()
    with reverb.TrajectoryIterator(address, "q", rate_limiter_timeout_ms=10_000) as it:
        sample = next(it)
    feeder.join()
    assert np.asarray(sample.data[0]).ravel().tolist() == [7.0]


CALLS: Dict[str, Callable[[str], None]] = {
    "server_info": lambda a: reverb.Client(a).server_info(timeout=10),
    "insert": _one_item,
    "mutate_priorities": lambda a: reverb.Client(a).mutate_priorities(
        "q", updates={1: 1.0}, timeout=10
    ),
    "reset": lambda a: reverb.Client(a).reset("q", timeout=10),
    "checkpoint": lambda a: reverb.Client(a).checkpoint(timeout=10),
    "sample": _sample,
    "trajectory_writer": _writer_flush,
    "trajectory_iterator": _iterator,
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_call_waits_for_a_server_started_later(late_server, call) -> None:
    address = f"localhost:{late_server.port}"
    start = time.monotonic()
    CALLS[call](address)
    assert time.monotonic() - start >= LATER * 0.9


def test_a_dataset_waits_for_a_server_started_later(tf, late_server) -> None:
    address = f"localhost:{late_server.port}"
    # A time, pacing (as in `_sample`).
    feeder = threading.Thread(target=lambda: (time.sleep(LATER + 0.5), _one_item(address)))
    feeder.start()
    dataset = reverb.TimestepDataset(
        address,
        "q",
        dtypes=(tf.float32,),
        shapes=(tf.TensorShape([]),),
        max_in_flight_samples_per_worker=1,
        rate_limiter_timeout_ms=10_000,
    )
    sample = next(iter(dataset))
    feeder.join()
    assert float(sample.data[0]) == 7.0


def test_a_tf_client_waits_for_a_server_started_later(tf, late_server) -> None:
    address = f"localhost:{late_server.port}"
    start = time.monotonic()
    reverb.TFClient(address).insert(
        [tf.constant(7.0)], tf.constant(["q"]), tf.constant([1.0], tf.float64)
    )
    assert time.monotonic() - start >= LATER * 0.9
    assert reverb.Client(address).server_info(timeout=10)["q"].current_size == 1


@pytest.mark.parametrize("call", ["server_info", "insert", "reset", "sample"])
def test_a_call_to_no_server_raises_deadline_exceeded_at_its_timeout(call) -> None:
    address = f"localhost:{_free_port()}"
    client = reverb.Client(address)
    calls = {
        "server_info": lambda: client.server_info(timeout=0.5),
        "insert": lambda: client.insert(np.float32(1.0), {"q": 1.0}, timeout=0.5),
        "reset": lambda: client.reset("q", timeout=0.5),
        "sample": lambda: list(client.sample("q", 1, timeout=0.5)),
    }
    start = time.monotonic()
    with pytest.raises(reverb.errors.DeadlineExceededError, match=address):
        calls[call]()
    assert 0.45 <= time.monotonic() - start < 3.0


def test_a_writer_waits_for_signatures_as_long_as_get_signature_timeout_ms(late_server) -> None:
    """`get_signature_timeout_ms` (from Reverb before 0.8; dm-acme 0.4's adders pass it)
    bounds how long a validating writer's first item of a table waits for the server."""
    writer = reverb.Client(f"localhost:{_free_port()}").trajectory_writer(
        1, get_signature_timeout_ms=500
    )
    writer.append({"x": np.float32(7.0)})
    start = time.monotonic()
    with pytest.raises(reverb.errors.DeadlineExceededError):
        writer.create_item("q", 1.0, {"x": writer.history["x"][-1]})
    assert 0.45 <= time.monotonic() - start < 3.0
    writer.close()
    # Long enough for a server started a second later: the item is stored.
    address = f"localhost:{late_server.port}"
    writer = reverb.Client(address).trajectory_writer(1, get_signature_timeout_ms=10_000)
    writer.append({"x": np.float32(7.0)})
    writer.create_item("q", 1.0, {"x": writer.history["x"][-1]})
    writer.flush(timeout_ms=10_000)
    writer.close()
    assert reverb.Client(address).server_info(timeout=10)["q"].current_size == 1
    with pytest.raises(ValueError, match="get_signature_timeout_ms"):
        reverb.Client(address).trajectory_writer(1, get_signature_timeout_ms=-1)


def test_a_call_without_timeout_gives_up_after_the_connect_wait(monkeypatch) -> None:
    monkeypatch.setenv("REVERB_CONNECT_WAIT_SECONDS", "0.5")
    address = f"localhost:{_free_port()}"
    client = reverb.Client(address)
    start = time.monotonic()
    with pytest.raises(reverb.errors.UnavailableError, match="could not be reached"):
        client.server_info()
    assert 0.45 <= time.monotonic() - start < 3.0
    # The wait is shared: once it passed, further calls fail at once.
    start = time.monotonic()
    with pytest.raises(reverb.errors.UnavailableError):
        client.reset("q")
    assert time.monotonic() - start < 0.5


def test_a_restarted_server_is_waited_for() -> None:
    """After its server went away, a client's next call waits for it to be back (its attempt
    could not connect, so nothing was sent: it waits and tries again within its timeout)."""
    port = _free_port()
    server = reverb.Server(_tables(), port=port)
    client = reverb.Client(f"localhost:{port}")
    assert client.server_info(timeout=10)["q"].current_size == 0
    server.stop()
    later = _LateServer(port)
    try:
        start = time.monotonic()
        assert client.server_info(timeout=10)["q"].current_size == 0
        assert time.monotonic() - start >= LATER * 0.5
    finally:
        later.stop()


def test_a_sample_waits_for_a_restarted_server_in_another_process(tmp_path) -> None:
    """`Client.sample` over gRPC: its server (another process) was killed since the last
    call; the next sample's stream cannot be opened, so it waits for the server to be back
    and opens it then (nothing was sampled before)."""
    from _standalone import start, stop

    port = _free_port()
    config = {"port": port, "tables": [{"name": "q", "queue": 10}]}
    proc, _, lines = start(config, tmp_path)
    client = reverb.Client(f"localhost:{port}")
    client.insert(np.float32(1.0), {"q": 1.0}, timeout=10)
    [[first]] = list(client.sample("q", 1, timeout=10))
    assert float(first.data[0]) == 1.0
    proc.kill()
    proc.wait(30)
    proc.stderr.close()
    restarted: list = []

    def restart() -> None:
        time.sleep(LATER)  # a time: the sample below must be made while no server is up
        restarted.append(start(config, tmp_path))
        reverb.Client(f"localhost:{port}").insert(np.float32(2.0), {"q": 1.0}, timeout=10)

    thread = threading.Thread(target=restart, daemon=True)
    thread.start()
    try:
        [[second]] = list(client.sample("q", 1, timeout=20))
        assert float(second.data[0]) == 2.0
    finally:
        thread.join(30)
        if restarted:
            stop(restarted[0][0], restarted[0][2])
    assert any("serving on port" in line for line in lines)
