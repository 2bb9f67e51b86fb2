"""Chunk data on disk (`reverb.Server(storage=reverb.DiskStorage(...))`): tables ten times
the cache sampled item by item, space back under churn, a flipped byte, a second server on
the directory, a full disk, checkpoints, the standalone server's config."""

from __future__ import annotations

import gc
import json
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest
import tensorflow as tf
from _metrics import scrape

import reverb

FRAME = (84, 84)
T = 10.0


def frame(step: int) -> np.ndarray:
    """An incompressible frame, the same for the same step."""
    return np.random.default_rng(step).integers(0, 256, FRAME, dtype=np.uint8)


def signature() -> dict:
    return {
        "frame": tf.TensorSpec(FRAME, tf.uint8),
        "step": tf.TensorSpec([], tf.int64),
    }


def tables(max_size: int = 10_000) -> list:
    return [
        reverb.Table(
            "uniform",
            reverb.selectors.Uniform(),
            reverb.selectors.Fifo(),
            max_size,
            reverb.rate_limiters.MinSize(1),
            signature=signature(),
        ),
        reverb.Table(
            "queue",
            reverb.selectors.Fifo(),
            reverb.selectors.Fifo(),
            max_size,
            reverb.rate_limiters.MinSize(1),
            max_times_sampled=1,
            signature=signature(),
        ),
    ]


def write(
    client: reverb.Client, steps: range, names=("uniform", "queue"), timeout: float = T
) -> None:
    """One item per step in each of `names` (the two share the step's chunks)."""
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        for step in steps:
            writer.append({"frame": frame(step), "step": np.int64(step)})
            for name in names:
                writer.create_item(
                    name,
                    1.0,
                    {"frame": writer.history["frame"][-1], "step": writer.history["step"][-1]},
                )
            if step % 50 == 49:
                writer.end_episode(timeout_ms=int(timeout * 1000))
        writer.flush(timeout_ms=int(timeout * 1000))


def check(sample: reverb.ReplaySample) -> int:
    """The sample's step, after checking its frame is that step's. (`Client.sample` gives
    the columns flattened: frame, step.)"""
    got, step = sample.data
    step = int(np.asarray(step).reshape(-1)[0])
    got = np.asarray(got).reshape(FRAME)
    np.testing.assert_array_equal(got, frame(step), err_msg=f"step {step}")
    return step


def test_a_table_ten_times_its_cache_serves_every_item(tmp_path, both_paths) -> None:
    cache = 256 << 10
    n = 400  # 400 frames of 7 KiB: 11x the cache
    storage = reverb.DiskStorage(tmp_path / "chunks", cache_bytes=cache)
    with reverb.Server(tables(), port=0, metrics_port=0, storage=storage) as server:
        client = server.localhost_client()
        write(client, range(n))
        seen = [check(s) for s in client.sample("queue", n, emit_timesteps=False, timeout=T)]
        assert sorted(seen) == list(range(n))
        for s in client.sample("uniform", 1000, emit_timesteps=False, timeout=T):
            check(s)
        metrics = scrape(server.metrics_port)
        assert metrics["reverb_storage_chunks"] == n  # the small step chunks stay in memory
        assert metrics["reverb_storage_cache_bytes"] <= cache
        assert metrics["reverb_storage_cache_limit_bytes"] == cache
        assert metrics["reverb_storage_cache_misses_total"] > 500
        assert metrics["reverb_storage_cache_hits_total"] > 0
        assert metrics["reverb_storage_read_seconds_total"] > 0
        assert metrics["reverb_storage_disk_bytes"] >= n * FRAME[0] * FRAME[1]
        assert metrics["reverb_storage_errors_total"] == 0
        # (The journal is synced every second: its changes reach the file.)
        deadline = time.monotonic() + T
        while scrape(server.metrics_port)["reverb_storage_journal_syncs_total"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        metrics = scrape(server.metrics_port)
        assert metrics["reverb_storage_journal_bytes"] > n * 100
        assert metrics["reverb_storage_journal_sync_seconds_total"] > 0


def test_the_data_path_gathers_batches_from_disk(tmp_path, both_paths) -> None:
    storage = reverb.DiskStorage(tmp_path / "chunks", cache_bytes=64 << 10)
    with reverb.Server(tables(), port=0, storage=storage) as server:
        client = server.localhost_client()
        write(client, range(100))
        dataset = (
            reverb.TrajectoryDataset.from_table_signature(
                server_address=f"localhost:{server.port}",
                table="uniform",
                max_in_flight_samples_per_worker=8,
            )
            .batch(16)
            .take(5)
        )
        for batch in dataset:
            steps = batch.data["step"].numpy()
            for i, step in enumerate(steps):
                np.testing.assert_array_equal(batch.data["frame"][i].numpy(), frame(int(step)))


def test_deleted_items_give_their_disk_space_back(tmp_path) -> None:
    storage = reverb.DiskStorage(tmp_path / "chunks", cache_bytes=1 << 20)
    with reverb.Server(tables(max_size=50), port=0, metrics_port=0, storage=storage) as server:
        client = server.localhost_client()
        write(client, range(300), names=("uniform",))
        deadline = time.monotonic() + T
        while scrape(server.metrics_port)["reverb_storage_chunks"] > 50:
            assert time.monotonic() < deadline, scrape(server.metrics_port)
            time.sleep(0.1)
        client.reset("uniform")
        # (A client keeps its last insert stream, which keeps the chunks the writer asked
        # it to keep, until the client goes.)
        del client
        gc.collect()
        while scrape(server.metrics_port)["reverb_storage_chunks"] > 0:
            assert time.monotonic() < deadline, scrape(server.metrics_port)
            time.sleep(0.1)


def test_a_flipped_byte_fails_the_sample_clearly_and_drops_the_item(tmp_path, both_paths) -> None:
    directory = tmp_path / "chunks"
    storage = reverb.DiskStorage(directory, cache_bytes=0)
    with reverb.Server(tables(), port=0, storage=storage) as server:
        client = server.localhost_client()
        write(client, range(1), names=("uniform",))
        (segment,) = directory.glob("*.seg")
        data = bytearray(segment.read_bytes())
        data[-100] ^= 0x08
        segment.write_bytes(bytes(data))
        with pytest.raises(reverb.ReverbError) as raised:
            list(client.sample("uniform", 1, emit_timesteps=False, timeout=T))
        message = str(raised.value)
        assert "fails its checksum" in message and str(directory) in message, message
        assert "was deleted" in message, message
        assert server.in_process_tables["uniform"].info.current_size == 0
        # The server goes on serving.
        write(client, range(5, 8), names=("uniform",))
        for s in client.sample("uniform", 10, emit_timesteps=False, timeout=T):
            assert check(s) in (5, 6, 7)


def test_a_directory_held_by_a_server_is_refused(tmp_path) -> None:
    storage = reverb.DiskStorage(tmp_path / "chunks")
    with reverb.Server(tables(), port=0, storage=storage):
        with pytest.raises(OSError, match="held by another server"):
            reverb.Server(tables(), port=0, storage=storage)


def test_storage_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match="storage must be"):
        reverb.Server(tables(), port=0, storage=3)
    with pytest.raises(ValueError, match="cache_bytes"):
        reverb.DiskStorage("/tmp/x", cache_bytes=-1)
    with pytest.raises(ValueError, match="sync_interval"):
        reverb.DiskStorage("/tmp/x", sync_interval="sometimes")
    with pytest.raises(ValueError, match="sync_interval"):
        reverb.DiskStorage("/tmp/x", sync_interval=0)


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs mounted for the test (skips where mounting is not allowed)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", f"reverb-{uuid.uuid4().hex[:8]}", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_fails_inserts_with_resource_exhausted_and_keeps_serving(small_disk) -> None:
    directory = small_disk / "chunks"
    storage = reverb.DiskStorage(directory, cache_bytes=0)
    with reverb.Server(tables(), port=0, storage=storage) as server:
        client = server.localhost_client()
        with pytest.raises(reverb.ReverbError) as raised:
            write(client, range(1000), names=("uniform",), timeout=2.0)
        message = str(raised.value)
        assert "RESOURCE_EXHAUSTED" in message or "ResourceExhausted" in message, message
        assert str(directory) in message, message
        stored = server.in_process_tables["uniform"].info.current_size
        assert 100 < stored < 1000
        # Everything stored is served, whole.
        for s in client.sample("uniform", 200, emit_timesteps=False, timeout=T):
            assert check(s) < stored + 50


def frames_in(path: str, table: str) -> list:
    """The steps of `table`'s items in the checkpoint at `path`, read without a server,
    after checking each item's frame is its step's."""
    with reverb.checkpoint.open(path) as ckpt:
        steps = []
        for item in ckpt.items(table):
            got, step = item.data  # (columns flattened: frame, step)
            step = int(np.asarray(step).reshape(-1)[0])
            np.testing.assert_array_equal(np.asarray(got).reshape(FRAME), frame(step))
            steps.append(step)
        return steps


def restored_steps(root, table: str, storage=None) -> list:
    """The steps a server restoring the checkpoints under `root` serves from `table`."""
    checkpointer = reverb.checkpointers.DefaultCheckpointer(str(root))
    with reverb.Server(tables(), port=0, checkpointer=checkpointer, storage=storage) as server:
        client = server.localhost_client()
        size = server.in_process_tables[table].info.current_size
        return [check(s) for s in client.sample(table, size, emit_timesteps=False, timeout=T)]


def test_a_checkpoint_on_another_filesystem_copies_the_chunks(tmp_path, small_disk) -> None:
    # (The chunks on the 2 MiB tmpfs, the checkpoint on the test's disk: no link can cross.)
    checkpointer = reverb.checkpointers.DefaultCheckpointer(str(tmp_path / "ckpt"))
    storage = reverb.DiskStorage(small_disk / "chunks", cache_bytes=32 << 10)
    with reverb.Server(tables(), port=0, checkpointer=checkpointer, storage=storage) as server:
        client = server.localhost_client()
        write(client, range(40))
        path = pathlib.Path(client.checkpoint(timeout=T))
        assert (path / "checkpoint.rvb").stat().st_size > 40 * FRAME[0] * FRAME[1]
        assert not list(path.glob("segments/*.seg"))
    assert sorted(restored_steps(tmp_path / "ckpt", "queue")) == list(range(40))


def test_a_checkpoint_links_the_stores_segments_and_outlives_the_store(tmp_path) -> None:
    checkpointer = reverb.checkpointers.DefaultCheckpointer(str(tmp_path / "ckpt"))
    store = tmp_path / "a"
    storage = reverb.DiskStorage(store, cache_bytes=32 << 10)
    with reverb.Server(tables(), port=0, checkpointer=checkpointer, storage=storage) as server:
        client = server.localhost_client()
        write(client, range(60))
        path = pathlib.Path(client.checkpoint(timeout=T))
        # No frame is copied: the file holds items and chunks' fields, the frames stay in
        # the store's segments, linked (the same files) into the checkpoint.
        assert (path / "checkpoint.rvb").stat().st_size < 60 * FRAME[0] * FRAME[1] // 10
        linked = {p.stat().st_ino for p in (path / "segments").glob("*.seg")}
        assert linked and linked <= {p.stat().st_ino for p in store.glob("*.seg")}
        # What the server does next (its items gone, more written) changes nothing saved.
        client.reset("uniform")
        client.reset("queue")
        write(client, range(1000, 1040))
    shutil.rmtree(store)
    assert sorted(frames_in(str(path), "queue")) == list(range(60))
    new_store = reverb.DiskStorage(tmp_path / "b", cache_bytes=32 << 10)
    assert sorted(restored_steps(tmp_path / "ckpt", "queue", new_store)) == list(range(60))
    assert len(list((tmp_path / "b").glob("*.seg"))) >= 1
    assert sorted(restored_steps(tmp_path / "ckpt", "queue")) == list(range(60))  # in memory


def test_the_standalone_server_takes_a_storage_config(tmp_path) -> None:
    config = {
        "port": 0,
        "storage": {"directory": str(tmp_path / "chunks"), "cache_bytes": 1 << 20},
        "tables": [{"name": "replay", "sampler": "uniform", "remover": "fifo", "max_size": 10}],
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    process = subprocess.Popen(
        [sys.executable, "-m", "reverb.server_main", "--config", str(path)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = process.stderr.readline()
            lines.append(line)
            if "serving on port" in line or not line:
                break
        text = "".join(lines)
        assert f"chunk data on disk in {tmp_path / 'chunks'} (cache 1048576 bytes)" in text, text
        assert (tmp_path / "chunks" / "LOCK").exists()
    finally:
        process.terminate()
        process.wait(timeout=T)
        process.stderr.close()
    bad = dict(config, storage={"dir": "x"})
    path.write_text(json.dumps(bad))
    done = subprocess.run(
        [sys.executable, "-m", "reverb.server_main", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and '"storage" must be' in done.stderr, done.stderr


def test_a_stopped_server_serves_everything_again_on_its_directory(tmp_path) -> None:
    storage = reverb.DiskStorage(tmp_path / "data", cache_bytes=64 << 10)
    first = tables()
    with reverb.Server(first, port=0, storage=storage) as server:
        write(server.localhost_client(), range(120))
        before = first[0].info
    # New tables, then the old ones (still alive) in another server.
    expected_queue = list(range(120))
    for again in (tables(), first):
        with reverb.Server(again, port=0, storage=storage) as server:
            client = server.localhost_client()
            info = again[0].info
            assert info.current_size == 120
            assert info.rate_limiter_info.insert_stats.completed == 120
            assert info.num_episodes == before.num_episodes
            for s in client.sample("uniform", 200, emit_timesteps=False, timeout=T):
                check(s)
            n = len(expected_queue)
            seen = [check(s) for s in client.sample("queue", n, emit_timesteps=False, timeout=T)]
            assert sorted(seen) == expected_queue
            # Sampled once, the queue's items were deleted: the next server has only these.
            write(client, range(200, 210), names=("queue",))
            expected_queue = list(range(200, 210))


def test_a_directory_with_tables_the_server_lacks_is_refused(tmp_path) -> None:
    storage = reverb.DiskStorage(tmp_path / "data")
    with reverb.Server(tables(), port=0, storage=storage) as server:
        write(server.localhost_client(), range(3))
    with pytest.raises(ValueError, match=r"holds tables \["):
        reverb.Server(tables()[:1], port=0, storage=storage)


SERVE = """
import sys, time
import reverb
table = reverb.Table("all", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 1_000_000,
                     reverb.rate_limiters.MinSize(1), max_times_sampled=1)
sync = sys.argv[2] if sys.argv[2] == "always" else float(sys.argv[2])
server = reverb.Server([table], port=0,
                       storage=reverb.DiskStorage(sys.argv[1], cache_bytes=1 << 20,
                                                  sync_interval=sync))
print(server.port, flush=True)
server.wait()
"""


# (The interval is the default: its bound holds while a sync takes at most half of it, which
# a 0.2 s interval did not always give on a loaded CI machine.)
@pytest.mark.parametrize("sync", ["1.0", "always"])
def test_kill_9_loses_nothing_confirmed_before_the_sync_interval(tmp_path, sync) -> None:
    """Three times: a server process on the directory, a writer sending frames (priority =
    step) and recording when each was confirmed, kill -9 mid-write. Then every item confirmed
    more than the sync interval before the kill (syncing "always": every item confirmed) is
    served, whole, with its priority (and deleted once read: the next round starts empty)."""
    directory = str(tmp_path / "data")
    interval = 0.0 if sync == "always" else float(sync)
    for cycle in range(3):
        confirmed = []  # (step, when confirmed)
        server = subprocess.Popen(
            [sys.executable, "-c", SERVE, directory, sync],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            port = int(server.stdout.readline())
            client = reverb.Client(f"localhost:{port}")
            stop = threading.Event()

            failures: list = []

            def actor(
                first: int, client=client, stop=stop, confirmed=confirmed, failures=failures
            ) -> None:
                # (Closed, not flushed, at the end: the server is dead by then.)
                writer = client.trajectory_writer(num_keep_alive_refs=1)
                try:
                    step = first
                    while not stop.is_set():
                        writer.append({"frame": frame(step), "step": np.int64(step)})
                        writer.create_item(
                            "all",
                            float(step + 1),
                            {
                                "frame": writer.history["frame"][-1],
                                "step": writer.history["step"][-1],
                            },
                        )
                        if step % 5 == 4:
                            # (Bounded: after the kill it fails within this; before it, a
                            # loaded machine may take seconds.)
                            writer.flush(timeout_ms=5000)
                            now = time.monotonic()
                            confirmed.extend((s, now) for s in range(step - 4, step + 1))
                        step += 1
                except reverb.ReverbError as e:
                    failures.append(e)  # the server was killed (or, before it, a failure)
                finally:
                    writer.close()

            thread = threading.Thread(target=actor, args=(cycle * 100_000,))
            thread.start()
            # Killed once a few dozen items were confirmed (syncing "always" confirms more
            # slowly), plus a while: mid-write, past the sync interval of the first ones.
            deadline = time.monotonic() + 60
            while len(confirmed) < 40 and time.monotonic() < deadline and thread.is_alive():
                time.sleep(0.01)
            assert thread.is_alive(), f"the writer stopped before the kill: {failures}"
            time.sleep(interval + 0.5)
            server.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            stop.set()
            thread.join(timeout=30)
            assert not thread.is_alive()
        finally:
            server.kill()
            server.wait(timeout=T)
            server.stdout.close()
        margin = 0.0 if sync == "always" else 0.1
        must_have = {s for s, when in confirmed if when < killed - interval - margin}
        assert len(must_have) > 20, len(must_have)
        table = reverb.Table(
            "all",
            reverb.selectors.Fifo(),
            reverb.selectors.Fifo(),
            1_000_000,
            reverb.rate_limiters.MinSize(1),
            max_times_sampled=1,
        )
        with reverb.Server([table], port=0, storage=reverb.DiskStorage(directory)) as check_server:
            size = table.info.current_size
            got = set()
            # (One item per call: a table that deletes what it samples. The timeout bounds
            # the whole call.)
            for s in check_server.localhost_client().sample(
                "all", size, emit_timesteps=False, timeout=120
            ):
                step = check(s)
                assert s.info.priority == step + 1
                got.add(step)
            assert must_have <= got, sorted(must_have - got)[:10]
            assert min(got) >= cycle * 100_000, "earlier rounds' items were deleted"
