"""Items larger than a message may be fail fast with the size and the limit, and the writer
that made them keeps working (REVERB_MAX_MESSAGE_BYTES sets the limit of clients and servers
made afterwards)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import reverb

LIMIT = 64 << 10
TMS = 10_000


@pytest.fixture
def small_messages(monkeypatch):
    monkeypatch.setenv("REVERB_MAX_MESSAGE_BYTES", str(LIMIT))
    monkeypatch.setenv("REVERB_NO_INPROC", "1")  # in-process calls have no messages
    server = reverb.Server([reverb.Table.queue("q", 10)])
    try:
        yield server, reverb.Client(f"localhost:{server.port}")
    finally:
        server.stop()


def _big() -> np.ndarray:
    # Random bytes: snappy cannot shrink them under the limit.
    return np.random.default_rng(0).integers(0, 2**62, size=LIMIT // 4, dtype=np.int64)


def test_insert_over_the_limit_fails_fast_and_later_inserts_work(small_messages) -> None:
    server, client = small_messages
    started = time.monotonic()
    with pytest.raises(ValueError, match=f"{LIMIT} bytes a message"):
        client.insert(_big(), {"q": 1.0})
    assert time.monotonic() - started < 5
    client.insert(np.arange(3), {"q": 1.0})
    assert client.server_info(timeout=10)["q"].current_size == 1


def test_trajectory_writer_reports_an_oversized_item_once(small_messages) -> None:
    server, client = small_messages
    with client.trajectory_writer(1) as writer:
        writer.append({"x": _big()})
        writer.create_item("q", 1.0, writer.history["x"][-1:])
        started = time.monotonic()
        with pytest.raises(ValueError, match=f"{LIMIT} bytes a message"):
            writer.flush(timeout_ms=TMS)
        assert time.monotonic() - started < 5
        writer.flush(timeout_ms=TMS)  # reported once
        writer.append({"y": np.int32(7)})
        writer.create_item("q", 1.0, writer.history["y"][-1:])
        writer.flush(timeout_ms=TMS)
    (sample,) = client.sample("q", 1, timeout=10)
    assert sample[0].data[0] == 7
