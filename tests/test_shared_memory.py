"""Samples from a server in another process on this host: big chunks (and the columns of
batches sent as columns) come through a shared-memory ring the client offers, with exactly
the bytes the socket would carry (`REVERB_NO_SHM=1`), for the numpy iterator and for
`TrajectoryDataset`."""

from __future__ import annotations

import ctypes
import pathlib

import numpy as np
import pytest
from _standalone import start, stop

import reverb
from reverb import _native

FRAME = (84, 84)
STEPS = 10
# 700 samples of 70 KB: the ring (8 MiB for 32 samples in flight) wraps around.
SAMPLES = 700


def _frame(t: int) -> np.ndarray:
    """An incompressible frame that starts with its step number."""
    frame = np.random.default_rng(t).integers(0, 256, FRAME, dtype=np.uint8)
    frame.flat[:8] = np.frombuffer(np.int64(t).tobytes(), np.uint8)
    return frame


def _check(items: np.ndarray) -> None:
    """Each item holds STEPS consecutive frames."""
    assert items.shape[1:] == (STEPS, *FRAME)
    for item in items:
        first = int(np.frombuffer(item[0].tobytes()[:8], np.int64)[0])
        for k in range(STEPS):
            np.testing.assert_array_equal(item[k], _frame(first + k))


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory):
    config = {
        "port": 0,
        "tables": [{"name": "u", "sampler": "uniform", "remover": "fifo", "max_size": 1000}],
    }
    tmp: pathlib.Path = tmp_path_factory.mktemp("shm")
    proc, port, lines = start(config, tmp)
    try:
        address = f"localhost:{port}"
        with reverb.Client(address).trajectory_writer(num_keep_alive_refs=STEPS) as writer:
            for t in range(60):
                writer.append({"frame": _frame(t)})
                if t >= STEPS - 1:
                    writer.create_item("u", 1.0, {"frame": writer.history["frame"][-STEPS:]})
        yield address
    finally:
        stop(proc, lines)


@pytest.fixture(params=["shm", "socket"])
def path(request, monkeypatch) -> str:
    if request.param == "socket":
        monkeypatch.setenv("REVERB_NO_SHM", "1")
    return request.param


def test_numpy_iterator(address: str, path: str) -> None:
    before = _native._shm_chunks_received()
    iterator = reverb.TrajectoryIterator(
        address, "u", batch_size=20, max_in_flight_samples_per_worker=32, max_samples=SAMPLES
    )
    total = 0
    for batch in iterator:
        (frames,) = batch.data  # no signature: a list of columns
        _check(frames)
        total += len(frames)
    assert total == SAMPLES
    through_ring = _native._shm_chunks_received() - before
    if path == "shm":
        # The samples of a response come as one column (a batching sampler asks for columns),
        # at most 32 (the samples in flight) a response.
        assert through_ring >= SAMPLES // 32, "each response's column comes through the ring"
    else:
        assert through_ring == 0


def _tf_ring_chunks() -> int:
    """Chunks the TensorFlow kernel library's samplers received through the ring (the library
    has its own copy of the client, and so its own count)."""
    from reverb import _tf_ops

    _tf_ops.ops()  # (ctypes then opens the library TensorFlow loaded, not a second copy)
    library = ctypes.CDLL(_tf_ops.library_path())
    library.reverb_tf_shm_chunks_received.restype = ctypes.c_uint64
    return int(library.reverb_tf_shm_chunks_received())


def test_tf_dataset(address: str, path: str) -> None:
    tf = pytest.importorskip("tensorflow")
    before = _tf_ring_chunks()
    dataset = reverb.TrajectoryDataset(
        address,
        "u",
        dtypes={"frame": tf.uint8},
        shapes={"frame": tf.TensorShape([STEPS, *FRAME])},
        max_in_flight_samples_per_worker=32,
        max_samples=SAMPLES,
    ).batch(20)
    total = 0
    for batch in dataset:
        _check(batch.data["frame"].numpy())
        total += int(batch.info.key.shape[0])
    assert total == SAMPLES
    through_ring = _tf_ring_chunks() - before
    if path == "shm":
        # (The kernel asks for columns too: a column per response, as above.)
        assert through_ring >= SAMPLES // 32, "each response's column comes through the ring"
    else:
        assert through_ring == 0
