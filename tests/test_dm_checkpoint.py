"""Migration: a checkpoint dm-reverb 0.14 wrote is restored by our server, item by item (keys,
priorities, times sampled, insertion order, data, chunks shared across tables, counters), and a
truncated or corrupt one is refused whole. Runs when REVERB_REFERENCE_PYTHON names a Python with
dm-reverb 0.14.0 (as tests/test_interop.py)."""

from __future__ import annotations

import json
import pathlib
import shutil

import _reference as reference
import numpy as np
import pytest

import reverb

pytestmark = pytest.mark.skipif(not reference.PYTHON, reason="REVERB_REFERENCE_PYTHON is not set")
NAMES = ["prio", "uniform", "fifo", "queue"]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict:
    """A checkpoint dm-reverb wrote, and what its tables held (tests/_dm_checkpoint_maker.py)."""
    root = tmp_path_factory.mktemp("dm-reverb")
    script = pathlib.Path(__file__).with_name("_dm_checkpoint_maker.py")
    out = reference.run(str(script), str(root), timeout=300)
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("RESULTS")]
    results = json.loads(line[len("RESULTS") :])
    results["root"] = str(root)
    return results


def _drain_tables() -> list[reverb.Table]:
    """Tables of the checkpoint's names that hand out each item once, oldest first."""
    return [
        reverb.Table(
            name,
            reverb.selectors.Fifo(),
            reverb.selectors.Fifo(),
            1000,
            reverb.rate_limiters.MinSize(1),
            max_times_sampled=1,
        )
        for name in NAMES
    ]


def _plain(x):
    if isinstance(x, bytes):
        return x.decode()
    if isinstance(x, np.ndarray):
        return _plain(x.tolist()) if x.dtype == object else x.tolist()
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return [_plain(x[k]) for k in sorted(x)]
    return x.item() if hasattr(x, "item") else x


def _data(table: str, data) -> object:
    """A sample's data as the maker wrote it down."""
    data = _plain(data)
    if table == "fifo":
        return data[0]
    return data


@pytest.mark.parametrize("how", ["root", "fallback"])
def test_every_item_comes_back_in_insertion_order(made, how) -> None:
    """Pointed at dm-reverb's checkpoint root (its latest checkpoint) or at the checkpoint
    itself as the fallback, our server restores every item: key, priority, times sampled,
    data, in insertion order."""
    if how == "root":
        checkpointer = reverb.checkpointers.DefaultCheckpointer(path=made["root"])
    else:
        checkpointer = reverb.checkpointers.DefaultCheckpointer(
            path=made["root"] + "-ours", fallback_checkpoint_path=made["path"]
        )
    server = reverb.Server(_drain_tables(), checkpointer=checkpointer)
    try:
        client = server.localhost_client()
        for name in NAMES:
            expected = made["items"][name]
            assert client.server_info()[name].current_size == len(expected), name
            got = list(client.sample(name, len(expected), emit_timesteps=False, timeout=10))
            for want, sample in zip(expected, got):
                assert _data(name, sample.data) == want["data"], name
                assert sample.info.priority == want["priority"], (name, want)
                # Sampling once more counted the draw.
                assert sample.info.times_sampled == want["times_sampled"] + 1, (name, want)
                if want["key"] is not None:
                    assert int(sample.info.key) == want["key"], (name, want)
            assert client.server_info()[name].current_size == 0
    finally:
        server.stop()


@pytest.mark.parametrize("how", ["root", "checkpoint"])
def test_the_offline_reader_reads_a_dm_reverb_checkpoint(made, how) -> None:
    """`reverb.checkpoint.open` on dm-reverb's root (its latest checkpoint) or on the
    checkpoint directory: every item, key, priority, times sampled and data, in order."""
    path = made["root"] if how == "root" else made["path"]
    with reverb.checkpoint.open(path) as ckpt:
        assert sorted(ckpt.tables) == sorted(NAMES)
        for name in NAMES:
            expected = made["items"][name]
            items = list(ckpt.items(name))
            assert ckpt.tables[name].num_items == len(items) == len(expected), name
            for want, item in zip(expected, items):
                assert _data(name, item.data) == want["data"], name
                assert item.priority == want["priority"], (name, want)
                assert item.times_sampled == want["times_sampled"], (name, want)
                if want["key"] is not None:
                    assert item.key == want["key"], (name, want)


def test_tables_serve_as_the_reference_would(made) -> None:
    """Restored into tables configured as dm-reverb's were: the counters, episodes and
    sampling probabilities the reference reported."""
    # (The checkpoint's tables, as the maker makes them, without the signature.)
    from _dm_checkpoint_maker import make_tables

    server = reverb.Server(
        make_tables(), checkpointer=reverb.checkpointers.DefaultCheckpointer(made["root"])
    )
    try:
        client = server.localhost_client()
        info = client.server_info()
        for name, want in made["info"].items():
            t = info[name]
            got = {
                "size": t.current_size,
                "episodes": t.num_episodes,
                "deleted_episodes": t.num_deleted_episodes,
                "inserts": t.rate_limiter_info.insert_stats.completed,
                "samples": t.rate_limiter_info.sample_stats.completed,
            }
            assert got == want, name
        priorities = {i["key"]: i["priority"] for i in made["items"]["prio"]}
        total = sum(p**0.8 for p in priorities.values())
        for sample in client.sample("prio", 20, emit_timesteps=False, timeout=10):
            key = int(sample.info.key)
            assert sample.info.probability == pytest.approx(priorities[key] ** 0.8 / total)
        # A queue hands its items out in insertion order, once.
        first = next(client.sample("queue", 1, emit_timesteps=False, timeout=10))
        assert _plain(first.data) == made["items"]["queue"][0]["data"]
        assert client.server_info()["queue"].current_size == len(made["items"]["queue"]) - 1
    finally:
        server.stop()


def _broken_copy(made, tmp_path, how: str) -> str:
    copy = tmp_path / pathlib.Path(made["path"]).name
    shutil.copytree(made["path"], copy)
    if how == "no DONE":
        (copy / "DONE").unlink()
    elif how == "truncated":
        chunks = copy / "chunks.tfrecord"
        chunks.write_bytes(chunks.read_bytes()[:-7])
    elif how == "flipped byte":
        items = copy / "items.tfrecord"
        raw = bytearray(items.read_bytes())
        raw[len(raw) // 2] ^= 0x40
        items.write_bytes(bytes(raw))
    elif how == "missing chunks":
        (copy / "chunks.tfrecord").write_bytes(b"")
    return str(copy)


@pytest.mark.parametrize("how", ["no DONE", "truncated", "flipped byte", "missing chunks"])
def test_a_broken_checkpoint_is_refused_whole(made, tmp_path, how) -> None:
    path = _broken_copy(made, tmp_path, how)
    checkpointer = reverb.checkpointers.DefaultCheckpointer(
        path=str(tmp_path / "ours"), fallback_checkpoint_path=path
    )
    with pytest.raises(ValueError, match="dm-reverb checkpoint") as raised:
        reverb.Server(_drain_tables(), checkpointer=checkpointer)
    assert path in str(raised.value)


@pytest.mark.parametrize("how", ["no DONE", "truncated", "flipped byte", "missing chunks"])
def test_the_offline_reader_refuses_a_broken_checkpoint(made, tmp_path, how, monkeypatch) -> None:
    """The reader converts dm-reverb's files into an unlinked temporary file of ours (so
    memory stays bounded); a broken checkpoint fails clearly, when opened or (an item
    whose chunks are missing) when that item is read, and leaves no temporary file."""
    path = _broken_copy(made, tmp_path, how)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    with pytest.raises(ValueError, match="tfrecord|DONE|chunk") as raised:
        with reverb.checkpoint.open(path) as ckpt:
            for name in ckpt.tables:
                list(ckpt.items(name))
    assert path in str(raised.value) or "chunk" in str(raised.value)
    assert list(scratch.iterdir()) == []
    # A sound one: read whole, and nothing left behind either.
    with reverb.checkpoint.open(made["path"]) as ckpt:
        assert list(scratch.iterdir()) == []
        assert sum(len(list(ckpt.items(name))) for name in ckpt.tables) > 0
