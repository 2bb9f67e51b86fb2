"""TrajectoryWriter end to end: chunking, history, items, episodes, flush, errors, reconnects."""

from __future__ import annotations

import collections
import copy
import gc
import threading
import time
import weakref

import numpy as np
import pytest
from _metrics import waiting
from _wait import wait_for

import reverb
from reverb import rate_limiters, selectors

# Every test runs twice: inserting into this process's server directly, and over gRPC.
pytestmark = pytest.mark.usefixtures("both_paths")

T = 10.0
TMS = 10_000


def _fifo(name: str, max_size: int = 1000) -> reverb.Table:
    """Items come out once each, in insertion order."""
    return reverb.Table(
        name,
        selectors.Fifo(),
        selectors.Fifo(),
        max_size,
        rate_limiters.MinSize(1),
        max_times_sampled=1,
    )


@pytest.fixture
def served(make_server):
    server = make_server([_fifo("a"), _fifo("b"), reverb.Table.queue("q", 2)], metrics_port=0)
    return server, server.localhost_client()


def _drain(client: reverb.Client, table: str) -> list:
    n = client.server_info(timeout=T)[table].current_size
    return list(client.sample(table, n, emit_timesteps=False, timeout=T)) if n else []


def test_readme_example(served) -> None:
    _, client = served
    with client.trajectory_writer(num_keep_alive_refs=3) as writer:
        writer.append({"a": 2, "b": 12})
        writer.append({"a": 3, "b": 13})
        writer.append({"a": 4, "b": 14})
        writer.create_item(
            table="a",
            priority=1.5,
            trajectory={"a": writer.history["a"][:], "b": writer.history["b"][:]},
        )
        writer.flush()
    (sample,) = _drain(client, "a")
    np.testing.assert_array_equal(sample.data[0], [2, 3, 4])
    np.testing.assert_array_equal(sample.data[1], [12, 13, 14])
    assert sample.info.priority == 1.5


def test_overlapping_windows_and_squeezed_columns(served) -> None:
    _, client = served
    writer = client.trajectory_writer(num_keep_alive_refs=3)
    for t in range(20):
        writer.append({"obs": np.full((2, 2), t, np.float32), "t": np.int64(t)})
        if t >= 2:
            writer.create_item(
                "a",
                1.0,
                {"obs": writer.history["obs"][-3:], "last": writer.history["t"][-1]},
            )
    writer.flush(timeout_ms=TMS)
    samples = _drain(client, "a")
    assert len(samples) == 18
    for i, sample in enumerate(samples):  # FIFO: in creation order
        last, obs = sample.data  # sorted keys: "last" < "obs"
        assert last.shape == () and int(last) == i + 2
        assert obs.shape == (3, 2, 2) and obs.dtype == np.float32
        np.testing.assert_array_equal(obs[:, 0, 0], [i, i + 1, i + 2])


def test_items_in_two_tables_share_history(served) -> None:
    _, client = served
    with client.trajectory_writer(2) as writer:
        for t in range(6):
            writer.append({"x": np.int32(t)})
            if t >= 1:
                column = writer.history["x"][-2:]
                writer.create_item("a", 1.0, column)
                writer.create_item("b", 2.0, column)
    a, b = _drain(client, "a"), _drain(client, "b")
    assert [s.data[0].tolist() for s in a] == [s.data[0].tolist() for s in b]
    assert [s.data[0].tolist() for s in a][:2] == [[0, 1], [1, 2]]
    assert {s.info.priority for s in b} == {2.0}


def test_episode_boundaries(served) -> None:
    server, client = served
    writer = client.trajectory_writer(4)
    for episode in range(3):
        for t in range(4):
            writer.append({"e": np.int32(episode), "t": np.int32(t)})
        assert writer.episode_steps == 4
        writer.create_item("a", 1.0, {"e": writer.history["e"][:], "t": writer.history["t"][:]})
        writer.end_episode(timeout_ms=TMS)
        assert writer.episode_steps == 0
        with pytest.raises(IndexError):
            writer.history["t"][-1]
    info = client.server_info(timeout=T)["a"]
    assert info.num_episodes == 3 and info.current_size == 3
    samples = _drain(client, "a")
    assert len(samples) == 3
    for episode, sample in enumerate(samples):
        np.testing.assert_array_equal(sample.data[0], [episode] * 4)
        np.testing.assert_array_equal(sample.data[1], [0, 1, 2, 3])


def test_end_episode_without_clearing_keeps_refs_alive(served) -> None:
    _, client = served
    writer = client.trajectory_writer(3)
    writer.append({"x": 1})
    writer.end_episode(clear_buffers=False, timeout_ms=TMS)
    writer.append({"x": 2})
    # The previous episode's cell is still alive in the column's buffer but no longer in the
    # history (which indexes the current episode).
    assert len(writer.history["x"]) == 1
    assert writer.history["x"][0].numpy() == 2


def test_history_indexing_and_columns(served) -> None:
    _, client = served
    writer = client.trajectory_writer(5)
    with pytest.raises(RuntimeError):
        writer.history  # noqa: B018 - the access is the test
    for t in range(4):
        writer.append({"v": np.arange(3, dtype=np.int16) + t, "s": float(t)})
    history = writer.history
    assert len(history["v"]) == 4
    col = history["v"][1:3]
    assert col.shape == (2, 3) and col.dtype == np.int16 and not col.is_squeezed
    np.testing.assert_array_equal(col.numpy(), [[1, 2, 3], [2, 3, 4]])
    one = history["s"][-1]
    assert one.is_squeezed and one.shape == () and one.numpy() == 3.0
    picked = history["v"][[0, 3]]
    np.testing.assert_array_equal(picked.numpy()[:, 0], [0, 3])
    assert len(col[0:1]) == 1 and col[0].is_squeezed
    with pytest.raises(IndexError):
        history["v"][4]


def test_columns_from_cell_references_and_nested_trajectories(served) -> None:
    _, client = served
    writer = client.trajectory_writer(5)
    for t in range(4):
        writer.append({"a": np.int32(t), "b": {"c": np.float32(-t)}})
    refs = list(writer.history["a"])
    assert len(refs) == 4 and [r.numpy() for r in refs] == [0, 1, 2, 3]
    made = reverb.TrajectoryColumn(refs[1:3])
    np.testing.assert_array_equal(made.numpy(), [1, 2])
    assert made.shape == (2,) and made[-1].numpy() == 2 and made[-1].is_squeezed
    np.testing.assert_array_equal(made[[1, 0]].numpy(), [2, 1])
    assert [r.numpy() for r in made] == [1, 2]
    assert reverb.TrajectoryColumn([refs[3]], squeeze=True).numpy() == 3
    assert "len=2" in repr(made) and "path=('a',)" in repr(writer.history["a"][1:3])
    with pytest.raises(ValueError, match="exactly one"):
        reverb.TrajectoryColumn(refs[:2], squeeze=True)
    with pytest.raises(ValueError, match="None references"):
        reverb.TrajectoryColumn([refs[0], None])
    with pytest.raises(IndexError, match="History index -5 out of range for 4 steps"):
        writer.history["a"][-5]
    with pytest.raises(IndexError):
        writer.history["a"][[0, 9]]
    with pytest.raises(IndexError):
        writer.history["a"][10**20]
    with pytest.raises(IndexError):
        made[0:0].dtype  # noqa: B018 - the access is the test
    picked = writer.history["a"][np.array([3, 1])]
    np.testing.assert_array_equal(picked.numpy(), [3, 1])
    assert writer.history["a"][np.int64(-1)].numpy() == 3
    np.testing.assert_array_equal(writer.history["a"][[np.int8(0), 2.0]].numpy(), [0, 2])
    assert copy.copy(made) is made and copy.deepcopy({"m": made})["m"] is made
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises(RecursionError):
        writer.create_item("a", 1.0, cyclic)
    history = writer.history
    # Tuples, lists and nested dicts flatten in tf.nest order (dict keys sorted).
    trajectory = (
        [history["b"]["c"][-2:]],
        collections.OrderedDict(z=history["a"][-1], y=history["a"][0:2]),
    )
    writer.create_item("a", 1.0, trajectory)
    writer.flush(timeout_ms=TMS)
    (sample,) = _drain(client, "a")
    assert [d.tolist() for d in sample.data] == [[-2.0, -3.0], [0, 1], 3]


def test_a_writer_whose_history_was_read_is_collected(served) -> None:
    _, client = served
    writer = client.trajectory_writer(2)
    writer.append({"x": 1})
    column = writer.history["x"][-1]
    ref = weakref.ref(writer)
    del writer, column
    gc.collect()
    assert ref() is None


def test_expired_references_are_rejected(served) -> None:
    _, client = served
    writer = client.trajectory_writer(2)
    for t in range(5):
        writer.append({"x": t})
    old = writer.history["x"][0:3]
    with pytest.raises(RuntimeError, match="expired"):
        old.numpy()
    with pytest.raises(ValueError, match="expired"):
        writer.create_item("a", 1.0, old)
    writer.create_item("a", 1.0, writer.history["x"][-2:])
    writer.flush(timeout_ms=TMS)
    assert [s.data[0].tolist() for s in _drain(client, "a")] == [[3, 4]]


def test_cell_references_and_history_read_the_native_cells(served) -> None:
    _, client = served
    writer = client.trajectory_writer(2)
    for t in range(4):
        writer.append({"x": np.array([t, -t], np.int64), "s": f"step{t}".encode()})
    refs = list(writer.history["x"])
    assert len(refs) == 4
    old, new = refs[0], refs[-1]
    assert old.expired and not new.expired
    assert new.shape == (2,) and new.dtype == np.int64
    np.testing.assert_array_equal(new.numpy(), [3, -3])
    with pytest.raises(RuntimeError, match=r"step 0 of column \('x',\): it has expired"):
        old.numpy()
    assert repr(new) == "CellRef(column=1, step=3)"  # (columns in tf.nest order: s, x)
    again = list(writer.history["x"])[-1]
    assert again == new and hash(again) == hash(new) and again != old and new != (1, 3)
    # The history's numpy() stacks the cells still alive (the last two), skipping the rest.
    np.testing.assert_array_equal(writer.history["x"].numpy(), [[2, -2], [3, -3]])
    strings = writer.history["s"]
    assert strings.numpy().tolist() == [b"step2", b"step3"]
    assert strings.numpy().dtype == object and strings[-1].numpy() == b"step3"
    assert strings[-2:].shape == (2,) and strings[-1].dtype == object
    with pytest.raises(TypeError, match="cell references"):
        reverb.TrajectoryColumn([(writer, 0, 3)])
    writer.close()


def test_none_leaves_are_fields_not_set_in_the_step(served) -> None:
    _, client = served
    with client.trajectory_writer(2) as writer:
        writer.append({"a": np.int32(1), "b": None}, partial_step=True)
        writer.append({"a": None, "b": np.float32(2)})
        writer.append({"a": np.int32(3), "b": np.float32(4)})
        assert writer.episode_steps == 2
        np.testing.assert_array_equal(writer.history["a"][:].numpy(), [1, 3])
        np.testing.assert_array_equal(writer.history["b"][:].numpy(), [2, 4])
        with pytest.raises(ValueError, match=r"Field \('a',\) has already been set"):
            writer.append({"a": np.int32(5)}, partial_step=True)
            writer.append({"a": np.int32(6)})


def test_append_errors_name_the_column_and_change_nothing(served) -> None:
    _, client = served
    writer = client.trajectory_writer(2)
    writer.append({"x": np.float32(1), "y": {"z": np.zeros(2)}})
    with pytest.raises(
        ValueError,
        match=r"wrong dtype provided for column \('x',\)\. Got int64 but expected float\.",
    ):
        writer.append({"x": np.int64(1), "y": {"z": np.zeros(2)}})
    with pytest.raises(
        ValueError,
        match=r"incompatible shape.*\('y', 'z'\)\. Got \[3\] which is incompatible with \[2\]",
    ):
        writer.append({"x": np.float32(1), "y": {"z": np.zeros(3)}})
    with pytest.raises(ValueError, match=r"Got \[2,2\] which is incompatible with \[2\]\."):
        writer.append({"x": np.float32(1), "y": {"z": np.zeros((2, 2))}})
    assert writer.episode_steps == 1
    writer.append({"x": np.float32(2)}, partial_step=True)
    with pytest.raises(ValueError, match=r"\('x',\) has already been set.*set to None but got: 3"):
        writer.append({"x": np.float32(3)})
    writer.append({"y": {"z": np.ones(2)}})
    assert writer.episode_steps == 2
    with pytest.raises(ValueError, match="Unsupported dtype"):
        writer.append({"s": np.array(["2020-01-01"], dtype="datetime64[D]")})
    writer.create_item("a", 1.0, {"x": writer.history["x"][:], "z": writer.history["y"]["z"][:]})
    writer.flush(timeout_ms=TMS)
    (sample,) = _drain(client, "a")
    np.testing.assert_array_equal(sample.data[0], [1.0, 2.0])


def test_structure_can_grow(served) -> None:
    _, client = served
    writer = client.trajectory_writer(3)
    writer.append({"a": 1})
    writer.append({"a": 2, "b": 20})
    assert set(writer.history) == {"a", "b"}
    writer.append({"a": 3})
    # No value for "b" at step 0 (it did not exist yet) nor at step 2 (not set).
    with pytest.raises(ValueError):
        writer.create_item("a", 1.0, writer.history["b"][:])
    with pytest.raises(ValueError, match="cannot contain any None data references"):
        writer.create_item("a", 1.0, writer.history["b"][1:])
    writer.create_item("a", 1.0, {"a": writer.history["a"][-2:], "b": writer.history["b"][1:2]})
    writer.flush(timeout_ms=TMS)
    (sample,) = _drain(client, "a")
    assert sample.data[0].tolist() == [2, 3] and sample.data[1].tolist() == [20]


def test_create_item_argument_errors(served) -> None:
    _, client = served
    writer = client.trajectory_writer(2)
    writer.append({"x": 1})
    with pytest.raises(TypeError):
        writer.create_item("a", 1.0, {"x": np.zeros(1)})
    with pytest.raises(reverb.errors.NotFoundError, match="nope.*Available tables: \\[a, b, q\\]"):
        writer.create_item("nope", 1.0, writer.history["x"][:])
    other = client.trajectory_writer(2)
    other.append({"x": 1})
    with pytest.raises(ValueError, match="this writer"):
        writer.create_item("a", 1.0, other.history["x"][:])
    with pytest.raises(ValueError):
        writer.flush(block_until_num_items=-1)
    with pytest.raises(ValueError):
        client.trajectory_writer(0)
    with pytest.raises(ValueError):
        writer.configure(("x",), num_keep_alive_refs=2, max_chunk_length=3)
    for refs in (0, -1, 1.5, None):
        with pytest.raises(ValueError, match=rf"num_keep_alive_refs \({refs}\) must be a positive"):
            writer.configure(("x",), num_keep_alive_refs=refs, max_chunk_length=None)


def test_configure_and_chunk_lengths(served) -> None:
    _, client = served
    writer = client.trajectory_writer(2)
    writer.configure(("x",), num_keep_alive_refs=10, max_chunk_length=5)
    for t in range(12):
        writer.append({"x": t, "y": -t})
    # "x" keeps 10 cells alive, "y" only 2.
    np.testing.assert_array_equal(writer.history["x"][2:].numpy(), np.arange(2, 12))
    with pytest.raises(RuntimeError):
        writer.history["y"][-3].numpy()
    writer.create_item("a", 1.0, writer.history["x"][-10:])
    writer.flush(timeout_ms=TMS)
    (sample,) = _drain(client, "a")
    np.testing.assert_array_equal(sample.data[0], np.arange(2, 12))


def test_append_steps_batched(served) -> None:
    _, client = served
    writer = client.trajectory_writer(100)
    writer.append_steps({"obs": np.arange(50, dtype=np.float32).reshape(25, 2), "r": np.ones(25)})
    assert writer.episode_steps == 25
    writer.create_item("a", 1.0, {"obs": writer.history["obs"][-4:], "r": writer.history["r"][-1]})
    writer.flush(timeout_ms=TMS)
    (sample,) = _drain(client, "a")
    np.testing.assert_array_equal(sample.data[0][:, 0], [42, 44, 46, 48])
    assert sample.data[1] == 1.0
    with pytest.raises(ValueError, match="leading"):
        writer.append_steps({"obs": np.zeros((3, 2), np.float32), "r": np.ones(4)})


def test_flush_times_out_on_a_blocked_table_and_loses_nothing(served) -> None:
    _, client = served
    writer = client.trajectory_writer(1)
    for t in range(3):
        writer.append({"x": t})
        writer.create_item("q", 1.0, writer.history["x"][-1])
    start = time.monotonic()
    with pytest.raises(reverb.DeadlineExceededError):
        writer.flush(timeout_ms=300)
    assert time.monotonic() - start < 5
    # The queue holds 2; sampling one lets the third in.
    first = next(client.sample("q", emit_timesteps=False, timeout=T))
    writer.flush(timeout_ms=TMS)
    rest = list(client.sample("q", 2, emit_timesteps=False, timeout=T))
    assert [int(s.data[0]) for s in [first, *rest]] == [0, 1, 2]


def test_back_pressure_bounds_unconfirmed_items(served) -> None:
    server, client = served
    writer = client.trajectory_writer(1, max_in_flight_items=2)
    done = threading.Event()

    def produce() -> None:
        for t in range(12):
            writer.append({"x": t})
            writer.create_item("q", 1.0, writer.history["x"][-1])
        done.set()

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    # The queue takes 2 items, the writer's window a few more: the producer must block. The
    # queue is full and an insert waits on it (facts), and the producer does not get done
    # meanwhile (a time, for a negative).
    wait_for(
        lambda: waiting(server.metrics_port, "q", "insert") == 1,
        T,
        "an insert to wait on the full queue",
    )
    assert client.server_info(timeout=T)["q"].current_size == 2
    assert not done.wait(0.2)
    got = [int(s.data[0]) for s in client.sample("q", 12, emit_timesteps=False, timeout=T)]
    assert done.wait(T)
    thread.join(T)
    assert got == list(range(12))


def test_reconnects_after_server_restart_on_the_same_port(make_server) -> None:
    first = make_server([_fifo("a")])
    port = first.port
    client = reverb.Client(f"localhost:{port}")
    writer = client.trajectory_writer(1)
    writer.append({"x": 1})
    writer.create_item("a", 1.0, writer.history["x"][-1])
    writer.flush(timeout_ms=TMS)
    first.stop()
    second = make_server([_fifo("a")], port=port)
    for t in range(2, 5):
        writer.append({"x": t})
        writer.create_item("a", 1.0, writer.history["x"][-1])
    writer.flush(timeout_ms=TMS)
    got = [int(s.data[0]) for s in _drain(second.localhost_client(), "a")]
    assert got == [2, 3, 4]


def test_insert_blocked_when_the_server_stops_goes_to_its_successor(make_server) -> None:
    first = make_server([reverb.Table.queue("q", 1)])
    port = first.port
    writer = reverb.Client(f"localhost:{port}").trajectory_writer(1)
    for t in range(2):
        writer.append({"x": t})
        writer.create_item("q", 1.0, writer.history["x"][-1])
    with pytest.raises(reverb.DeadlineExceededError):
        writer.flush(timeout_ms=300)  # item 1 waits for room in the queue
    first.stop()
    second = make_server([reverb.Table.queue("q", 1)], port=port)
    client = second.localhost_client()
    got = []
    deadline = time.monotonic() + T
    # Until the blocked item arrives (resent items arrive in order, it last). Not until the
    # writer has no unconfirmed items: its count may lag a sample of the last one, and one
    # more sample would then wait for an item that never comes.
    while 1 not in got and time.monotonic() < deadline:
        got += [int(s.data[0]) for s in client.sample("q", 1, emit_timesteps=False, timeout=T)]
    writer.flush(timeout_ms=TMS)
    got += [int(s.data[0]) for s in _drain(client, "q")]
    # Unconfirmed items are sent again (at least once); the blocked one is not lost.
    assert got[-1] == 1 and set(got) <= {0, 1}


def test_server_gone_gives_an_error_within_the_timeout(make_server) -> None:
    server = make_server([_fifo("a")])
    writer = server.localhost_client().trajectory_writer(1)
    writer.append({"x": 1})
    writer.create_item("a", 1.0, writer.history["x"][-1])
    writer.flush(timeout_ms=TMS)
    server.stop()
    writer.append({"x": 2})
    writer.create_item("a", 1.0, writer.history["x"][-1])
    start = time.monotonic()
    with pytest.raises(reverb.ReverbError):
        writer.flush(timeout_ms=500)
    assert time.monotonic() - start < 5


def test_concurrent_writers(served) -> None:
    _, client = served
    errors = []

    def write(worker: int) -> None:
        try:
            with client.trajectory_writer(2) as writer:
                for t in range(50):
                    writer.append({"w": np.int32(worker), "t": np.int32(t)})
                    if t:
                        writer.create_item(
                            "a", 1.0, {"w": writer.history["w"][-2:], "t": writer.history["t"][-2:]}
                        )
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors
    samples = _drain(client, "a")
    assert len(samples) == 8 * 49
    by_worker: dict = {}
    for s in samples:
        t, w = s.data  # sorted keys
        assert w[0] == w[1] and t[1] == t[0] + 1
        by_worker.setdefault(int(w[0]), []).append(int(t[0]))
    assert all(sorted(v) == list(range(49)) for v in by_worker.values())


def test_one_writer_shared_by_threads_is_safe(served) -> None:
    """Calls are serialized: with each append + create_item pair under the caller's lock,
    every item holds its own thread's value; nothing is lost or corrupted."""
    _, client = served
    writer = client.trajectory_writer(1)
    lock = threading.Lock()

    def write(value: int) -> None:
        for _ in range(100):
            with lock:
                writer.append({"x": np.int64(value)})
                writer.create_item("a", 1.0, writer.history["x"][-1])
            writer.flush(timeout_ms=TMS)  # concurrent flushes, outside the lock

    threads = [threading.Thread(target=write, args=(v,)) for v in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    writer.flush(timeout_ms=TMS)
    values = [int(s.data[0]) for s in _drain(client, "a")]
    assert sorted(values) == sorted(list(range(4)) * 100)


def test_context_manager_flushes_unless_reverb_error(served) -> None:
    _, client = served
    with pytest.raises(KeyError):
        with client.trajectory_writer(1) as writer:
            writer.append({"x": 1})
            writer.create_item("a", 1.0, writer.history["x"][-1])
            raise KeyError("not a reverb error: the writer still flushes")
    assert client.server_info(timeout=T)["a"].current_size == 1
    writer.close()
    with pytest.raises(RuntimeError, match="Close has been called"):
        writer.append({"x": 2})


def test_delta_encoded_columns_round_trip(served) -> None:
    _, client = served
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 255, (6, 4, 4), dtype=np.uint8)
    with client.trajectory_writer(6, delta_encode=True) as writer:
        for t in range(6):
            writer.append({"frame": frames[t], "count": np.int64(1000 + t), "f": np.float32(t)})
        np.testing.assert_array_equal(writer.history["frame"][:].numpy(), frames)
        writer.create_item(
            "a",
            1.0,
            {
                "frame": writer.history["frame"][:],
                "count": writer.history["count"][:],
                "f": writer.history["f"][:],
            },
        )
    (sample,) = _drain(client, "a")
    count, f, frame = sample.data  # sorted keys
    np.testing.assert_array_equal(frame, frames)
    np.testing.assert_array_equal(count, np.arange(1000, 1006))
    np.testing.assert_array_equal(f, np.arange(6, dtype=np.float32))


def test_client_insert_uses_one_stream_and_survives_a_server_restart(
    make_server, both_paths
) -> None:
    first = make_server([_fifo("a")])
    client = first.localhost_client()
    for v in range(5):
        client.insert({"v": np.int64(v), "w": np.zeros(v + 1)}, {"a": 1.0}, timeout=T)
    assert client.server_info(timeout=T)["a"].num_episodes == 5  # one episode per insert
    port = first.port
    first.stop()
    second = make_server([_fifo("a")], port=port)
    client.insert({"v": np.int64(9)}, {"a": 1.0}, timeout=T)
    (sample,) = _drain(second.localhost_client(), "a")
    assert sample.data[0].tolist() == [9]


def test_inserts_from_several_threads_on_one_client_each_store_their_item(
    make_server, both_paths
) -> None:
    server = make_server([_fifo("a")])
    client = server.localhost_client()
    failures: list = []

    def insert(thread: int) -> None:
        try:
            for i in range(40):
                client.insert(np.int64(thread * 1000 + i), {"a": 1.0}, timeout=T)
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=insert, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    values = sorted(s.data[0].item() for s in _drain(client, "a"))
    assert values == sorted(t * 1000 + i for t in range(4) for i in range(40))


def test_an_append_that_fails_leaves_the_history_whole(served) -> None:
    _, client = served
    with client.trajectory_writer(2) as writer:
        with pytest.raises(ValueError):
            writer.append({"a": np.zeros(2, "datetime64[s]")})  # an unsupported dtype
        writer.append({"a": np.int32(1)})
        assert writer.history["a"][-1].numpy() == 1
        with pytest.raises(ValueError):
            writer.append({"a": np.int32(2), "b": object()})  # nothing of it is appended
        writer.append({"a": np.int32(3), "b": np.float32(4)})
        assert writer.history["b"][-1].numpy() == 4.0
        assert writer.history["a"][:].numpy().tolist() == [1, 3]


def _checkpoint_bytes(client: reverb.Client) -> int:
    import os

    path = client.checkpoint()
    return sum(
        os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files
    )


def test_chunks_shared_by_two_tables_are_stored_once_and_freed_with_the_last_item(
    make_server, tmp_path
) -> None:
    """Seen from outside through checkpoints, which hold every chunk some item references."""
    checkpointer = reverb.checkpointers.DefaultCheckpointer(str(tmp_path))
    server = reverb.Server([_fifo("a"), _fifo("b")], checkpointer=checkpointer)
    try:
        client = server.localhost_client()
        empty = _checkpoint_bytes(client)
        rng = np.random.default_rng(0)
        frames = rng.integers(0, 255, (20, 128, 128), dtype=np.uint8)  # incompressible
        with client.trajectory_writer(4) as writer:
            for t in range(20):
                writer.append({"frame": frames[t]})
                if t >= 3:
                    column = writer.history["frame"][-4:]
                    writer.create_item("a", 1.0, column)
                    writer.create_item("b", 1.0, column)
        stored = _checkpoint_bytes(client) - empty
        # Every frame once (plus small headers), not once per table or per item.
        assert frames.nbytes <= stored < 1.2 * frames.nbytes
        client.reset("a")
        assert _checkpoint_bytes(client) - empty >= frames.nbytes  # b still holds them
        client.reset("b")
        assert _checkpoint_bytes(client) - empty < 0.05 * frames.nbytes
    finally:
        server.stop()


def test_client_insert_to_a_stopped_server_fails_within_seconds(make_server) -> None:
    server = make_server([_fifo("a")])
    client = server.localhost_client()
    client.insert({"v": np.int64(1)}, {"a": 1.0}, timeout=T)  # keeps its insert stream
    server.stop()
    start = time.monotonic()
    with pytest.raises(reverb.errors.UnavailableError):
        client.insert({"v": np.int64(2)}, {"a": 1.0}, timeout=T)
    # The kept stream fails, then one retry on a fresh connection fails at once.
    assert time.monotonic() - start < 5


def test_a_refused_end_episode_leaves_the_episode_as_it_was(make_server) -> None:
    server = make_server([reverb.Table.queue("q", 10)])
    writer = server.localhost_client().trajectory_writer(1)
    for t in range(3):
        writer.append({"x": np.int64(t)})
    with pytest.raises(ValueError):
        writer.end_episode(timeout_ms=-1)
    assert writer.episode_steps == 3
    writer.append({"x": np.int64(100)})
    writer.create_item("q", 1.0, writer.history["x"][-1])
    writer.flush(timeout_ms=TMS)
    (sample,) = server.localhost_client().sample("q", 1, emit_timesteps=False, timeout=T)
    assert int(sample.data[0]) == 100


def test_a_table_observed_after_each_step_grows_by_one_item_per_step(served) -> None:
    """An item reaches the server without waiting for later appends (TF-Agents' observers
    watch table sizes after each step): with steps at an environment's pace, the automatic
    chunking sends each 2-step item at once."""
    _, client = served
    writer = client.trajectory_writer(2)
    for step in range(6):
        writer.append({"o": np.float32(step), "a": np.int32(step)})
        if step >= 1:
            writer.create_item("a", 1.0, {"o": writer.history["o"][-2:]})
        wait_for(
            lambda step=step: client.server_info(timeout=T)["a"].current_size == step,
            T,
            f"{step} items after step {step}",
        )
    # Same items as ever: each holds its two steps.
    got = [s.data[0].tolist() for s in client.sample("a", 5, emit_timesteps=False, timeout=T)]
    assert got == [[0.0, 1.0], [1.0, 2.0], [2.0, 3.0], [3.0, 4.0], [4.0, 5.0]]
    writer.close()


def test_an_explicit_chunk_length_is_kept_by_slow_writers(served) -> None:
    """A column configured with a chunk length keeps it: its items wait for the chunk."""
    _, client = served
    writer = client.trajectory_writer(2)
    writer.append({"o": np.float32(0.0)})
    writer.configure(("o",), num_keep_alive_refs=2, max_chunk_length=2)
    writer.append({"o": np.float32(1.0)})
    writer.create_item("a", 1.0, {"o": writer.history["o"][-1:]})
    time.sleep(0.3)  # a time: the item must NOT reach the server before its chunk is full
    assert client.server_info(timeout=T)["a"].current_size == 0
    writer.flush(timeout_ms=TMS)
    assert client.server_info(timeout=T)["a"].current_size == 1
    writer.close()


def test_leaving_with_an_exception_reports_it_not_a_refusal_of_the_flush(make_server) -> None:
    """An exception leaving a `with` block is the one raised, though the bounded flush on the
    way out is refused (a priority the prioritized table does not take); the items before the
    refused one are stored."""
    table = reverb.Table(
        "p", selectors.Prioritized(0.8), selectors.Fifo(), 10, rate_limiters.MinSize(1)
    )
    client = make_server([table]).localhost_client()
    with pytest.raises(RuntimeError, match="the caller's"):
        with client.trajectory_writer(1) as writer:
            writer.append({"x": np.int32(1)})
            writer.create_item("p", 1.0, {"x": writer.history["x"][-1]})
            writer.flush()
            writer.append({"x": np.int32(2)})
            writer.create_item("p", -1.0, {"x": writer.history["x"][-1]})
            raise RuntimeError("the caller's")
    assert client.server_info(timeout=T)["p"].current_size == 1
