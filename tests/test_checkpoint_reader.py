"""`reverb.checkpoint.open`: a checkpoint read without a server gives back every table's
settings and every item (key, priority, times sampled, episode, data) as the server held
them; corrupt or partial checkpoints are refused."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import reverb
from reverb import checkpointers, rate_limiters, selectors

T = 10.0


def _tables() -> list:
    return [
        reverb.Table(
            "prio",
            selectors.Prioritized(0.8),
            selectors.Fifo(),
            20,
            rate_limiters.MinSize(1),
        ),
        reverb.Table.queue("queue", 100),
    ]


def _server(root: pathlib.Path) -> reverb.Server:
    return reverb.Server(_tables(), checkpointer=checkpointers.DefaultCheckpointer(str(root)))


def _fill(client: reverb.Client) -> None:
    """Three episodes of 10 steps; items of 3 steps in `prio` (24: the 4 oldest are removed)
    and of the last step in `queue`; some of both sampled."""
    with client.trajectory_writer(3) as w:
        for episode in range(3):
            for t in range(10):
                w.append({"obs": np.full([2], 100 * episode + t, np.float32), "t": np.int64(t)})
                if t >= 2:
                    w.create_item("prio", float(t), {"obs": w.history["obs"][-3:]})
                    w.create_item(
                        "queue", 1.0, {"t": w.history["t"][-1], "obs": w.history["obs"][-1]}
                    )
            w.end_episode(timeout_ms=int(T * 1000))
    list(client.sample("prio", 7, emit_timesteps=False, timeout=T))
    list(client.sample("queue", 2, emit_timesteps=False, timeout=T))


def test_tables_and_items_come_back_as_the_server_held_them(tmp_path: pathlib.Path) -> None:
    server = _server(tmp_path)
    client = server.localhost_client()
    _fill(client)
    info = client.server_info(timeout=T)
    path = client.checkpoint(timeout=T)
    server.stop()

    with reverb.checkpoint.open(path) as ckpt:
        assert set(ckpt.tables) == {"prio", "queue"}
        prio = ckpt.tables["prio"]
        assert prio.num_items == info["prio"].current_size == 20
        assert prio.max_size == 20 and prio.sampler_options.HasField("prioritized")
        assert prio.rate_limiter.sample_count == 7
        assert prio.rate_limiter.insert_count == 24
        assert prio.rate_limiter.delete_count == 4
        assert ckpt.tables["queue"].num_items == info["queue"].current_size == 22
        assert ckpt.tables["queue"].max_times_sampled == 1

        # In insertion order, after the FIFO remover took the 4 oldest: (episode, t) with
        # rows t-2..t, priority t.
        made = [(e, t) for e in range(3) for t in range(2, 10)][4:]
        items = list(ckpt.items("prio"))
        assert [i.step for i in items] == [t - 2 for _, t in made]
        # Each column's episode, first step and rows.
        assert [i.spans for i in items] == [
            ((i.episode_id, t - 2, 3),) for (_, t), i in zip(made, items)
        ]
        assert [i.priority for i in items] == [float(t) for _, t in made]
        episodes = [i.episode_id for i in items]
        assert len(set(episodes)) == 3
        assert [episodes.index(x) for x in episodes] == [
            [e for e, _ in made].index(e) for e, _ in made
        ]
        assert sum(i.times_sampled for i in items) == 7
        assert len({i.key for i in items}) == 20
        for (episode, t), item in zip(made, items):
            [obs] = item.data
            expected = np.array([[100 * episode + t - 2 + k] * 2 for k in range(3)], np.float32)
            np.testing.assert_array_equal(obs, expected)
            assert item.inserted_at is not None and item.inserted_at.year >= 2024

        queue = list(ckpt.items("queue", data=False))
        assert [q.data for q in queue] == [None] * 22
        assert [q.step for q in queue] == (list(range(2, 10)) * 3)[2:]
        # (Metadata only: spans come from the opening read's index, no chunk is read.)
        assert [q.spans for q in queue] == [((q.episode_id, q.step, 1),) * 2 for q in queue]
        # Columns in the writer's flattened order (dict keys sorted): obs, t.
        [obs_col, t_col] = next(iter(ckpt.items("queue"))).data
        assert int(t_col) == 4 and obs_col.tolist() == [4.0, 4.0]

    # A root directory opens its latest checkpoint.
    with reverb.checkpoint.open(str(tmp_path)) as latest:
        assert latest.path == str(pathlib.Path(path) / reverb.checkpoint.FILE)


def test_bad_paths_and_corrupt_files_are_refused(tmp_path: pathlib.Path) -> None:
    server = _server(tmp_path / "root")
    client = server.localhost_client()
    _fill(client)
    path = pathlib.Path(client.checkpoint(timeout=T))
    server.stop()
    file = path / reverb.checkpoint.FILE
    data = file.read_bytes()

    with pytest.raises(ValueError, match="no such checkpoint"):
        reverb.checkpoint.open(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no checkpoint"):
        reverb.checkpoint.open(str(tmp_path / "empty"))
    # A dm-reverb checkpoint directory missing its files is refused, naming it.
    dm = tmp_path / "dm"
    dm.mkdir()
    (dm / "DONE").write_text("")
    (dm / "tables.tfrecord").write_bytes(b"")
    with pytest.raises(ValueError, match=str(dm)):
        reverb.checkpoint.open(str(dm))
    with reverb.checkpoint.open(str(path)) as ckpt, pytest.raises(KeyError, match="no table"):
        next(ckpt.items("nope"))

    for name, damaged in [
        ("truncated", data[: len(data) // 2]),
        ("flipped", data[:100] + bytes([data[100] ^ 0x10]) + data[101:]),
        ("not a checkpoint", b"hello world, not a checkpoint"),
    ]:
        bad = tmp_path / f"{name}.rvb"
        bad.write_bytes(damaged)
        with pytest.raises(ValueError, match=r"corrupt checkpoint") as e:
            reverb.checkpoint.open(str(bad))
        assert str(bad) in str(e.value), name
