"""`reverb export` / `reverb.parquet.export`: a checkpoint's tables become Parquet files whose
rows are the checkpoint's items (metadata and data) in insertion order; `reverb import` /
`reverb.parquet.load` seed a live table with them (the round trip gives the same items)."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reverb
from reverb import cli

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

T = 10.0

# (TensorFlow, for the signature, takes seconds to import.)
pytestmark = pytest.mark.slow


def _tables(root: pathlib.Path) -> reverb.Server:
    """`frames` (signature: obs uint8[.., 4, 3] and a text label) and `plain` (no signature),
    checkpointed under `root`."""
    signature = None
    try:
        import tensorflow as tf

        signature = {
            "obs": tf.TensorSpec([None, 4, 3], tf.uint8),
            "label": tf.TensorSpec([], tf.string),
        }
    except ImportError:
        pass
    frames = reverb.Table(
        "frames",
        reverb.selectors.Uniform(),
        reverb.selectors.Fifo(),
        100,
        reverb.rate_limiters.MinSize(1),
        signature=signature,
    )
    plain = reverb.Table.queue("plain", 100)
    return reverb.Server(
        [frames, plain], checkpointer=reverb.checkpointers.DefaultCheckpointer(str(root))
    )


def _checkpoint(root: pathlib.Path) -> str:
    """Items of 1 to 3 steps in `frames`, scalar items in `plain`; some sampled."""
    server = _tables(root)
    client = server.localhost_client()
    rng = np.random.default_rng(0)
    with client.trajectory_writer(3) as w:
        for t in range(7):
            w.append(
                {
                    "obs": rng.integers(0, 255, (4, 3), dtype=np.uint8),
                    # (Trailing NUL bytes must survive the round trip.)
                    "label": f"step {t}".encode() + b"\x00" * (t % 3),
                }
            )
            length = min(t + 1, 3)
            w.create_item(
                "frames",
                float(t),
                {"obs": w.history["obs"][-length:], "label": w.history["label"][-1]},
            )
        w.end_episode(timeout_ms=int(T * 1000))
    for i in range(5):
        client.insert([np.float64(i / 2)], {"plain": 1.0 + i}, timeout=T)
    list(client.sample("frames", 3, emit_timesteps=False, timeout=T))
    path = client.checkpoint(timeout=T)
    server.stop()
    return path


def test_export_writes_every_item_as_a_row(tmp_path: pathlib.Path, capsys) -> None:
    source = _checkpoint(tmp_path / "ckpt")
    out = tmp_path / "out"
    argv = ["export", source, "--to", str(out), "--batch-rows", "2", "--rows", "items"]
    assert cli.main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == ["frames.parquet", "plain.parquet"]

    with reverb.checkpoint.open(source) as ckpt:
        expected = list(ckpt.items("frames"))
        names = ckpt.tables["frames"].column_names
    table = pq.read_table(out / "frames.parquet")
    assert table.schema.metadata[b"reverb.table"] == b"frames"
    assert table.schema.metadata[b"reverb.rows"] == b"items"
    data_columns = table.column_names[6:]
    if names:  # the signature's names (label, obs in tf.nest order)
        assert data_columns == names == ["label", "obs"]
    else:
        assert data_columns == ["column_0", "column_1"]
    rows = table.to_pylist()
    assert len(rows) == len(expected) == 7
    for row, item in zip(rows, expected):
        assert row["key"] == item.key and row["priority"] == item.priority
        assert row["times_sampled"] == item.times_sampled
        assert row["episode_id"] == item.episode_id and row["step"] == item.step
        assert row["inserted_at"] == item.inserted_at
        label, obs = (row[c] for c in data_columns)
        assert label == item.data[0].item()
        np.testing.assert_array_equal(np.array(obs, np.uint8), item.data[1])
    # Items of 1, 2, then 3 steps: the first dimension varies, the others are fixed.
    assert [len(r[data_columns[1]]) for r in rows] == [1, 2, 3, 3, 3, 3, 3]
    obs_type = table.schema.field(data_columns[1]).type
    assert pa.types.is_list(obs_type)
    assert pa.types.is_fixed_size_list(obs_type.value_type)
    assert obs_type.value_type.list_size == 4 and obs_type.value_type.value_type.list_size == 3
    assert sum(r["times_sampled"] for r in rows) == 3

    plain = pq.read_table(out / "plain.parquet").to_pylist()
    assert [r["priority"] for r in plain] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert [r["column_0"] for r in plain] == [[0.0], [0.5], [1.0], [1.5], [2.0]]


def test_export_of_one_table_and_bad_input(tmp_path: pathlib.Path, capsys) -> None:
    source = _checkpoint(tmp_path / "ckpt")
    from reverb import parquet

    written = parquet.export(source, str(tmp_path / "one"), ["plain"], rows="items")
    assert list(written) == ["plain"]
    assert written["plain"].rows == "items" and written["plain"].count == 5
    assert pq.read_table(written["plain"].path).num_rows == 5
    assert cli.main(["export", source, "--to", str(tmp_path / "x"), "--table", "nope"]) == 1
    assert "no table 'nope'" in capsys.readouterr().err
    bad = tmp_path / "bad.rvb"
    bad.write_bytes(b"nope")
    assert cli.main(["export", str(bad), "--to", str(tmp_path / "y")]) == 1
    assert "corrupt checkpoint" in capsys.readouterr().err


def test_import_seeds_a_table_with_the_exported_items(tmp_path: pathlib.Path, capsys) -> None:
    source = _checkpoint(tmp_path / "ckpt")
    out = tmp_path / "out"
    assert cli.main(["export", source, "--to", str(out), "--rows", "items"]) == 0
    server = _tables(tmp_path / "fresh")
    try:
        address = f"localhost:{server.port}"
        for table in ("frames", "plain"):
            path = str(out / f"{table}.parquet")
            assert cli.main(["import", path, "--to", address]) == 0
        assert "7 items into" in capsys.readouterr().out
        copy = server.localhost_client().checkpoint(timeout=T)
    finally:
        server.stop()
    with reverb.checkpoint.open(source) as a, reverb.checkpoint.open(copy) as b:
        for table in ("frames", "plain"):
            old, new = list(a.items(table)), list(b.items(table))
            assert len(old) == len(new) > 0
            for x, y in zip(old, new):
                assert (x.priority, x.squeezed) == (y.priority, y.squeezed)
                assert y.times_sampled == 0 and y.key != x.key
                assert len(x.data) == len(y.data)
                for u, v in zip(x.data, y.data):
                    assert u.dtype == v.dtype and u.shape == v.shape
                    np.testing.assert_array_equal(u, v)
    # A file whose table the server lacks: a clear error, nothing written.
    other = reverb.Server([reverb.Table.queue("elsewhere", 10)])
    try:
        path = str(out / "plain.parquet")
        assert cli.main(["import", path, "--to", f"localhost:{other.port}"]) == 1
        assert "plain" in capsys.readouterr().err
        assert other.localhost_client().server_info(timeout=T)["elsewhere"].current_size == 0
    finally:
        other.stop()


def test_a_failed_export_leaves_no_file(tmp_path: pathlib.Path, capsys) -> None:
    """Items whose columns change dtype cannot share a Parquet column: the export fails
    and neither the file nor its partial remains."""
    server = reverb.Server([reverb.Table.queue("mixed", 10)])
    client = server.localhost_client()
    client.insert([np.int64(1)], {"mixed": 1.0}, timeout=T)
    client.insert([np.float64(2.5)], {"mixed": 1.0}, timeout=T)
    path = client.checkpoint(timeout=T)
    server.stop()
    out = tmp_path / "out"
    assert cli.main(["export", path, "--to", str(out)]) == 1
    assert "cannot share a Parquet column" in capsys.readouterr().err
    assert list(out.iterdir()) == []


def test_export_reassembles_episodes_into_steps(tmp_path: pathlib.Path, capsys) -> None:
    """Items that together hold every step of their episodes (windows here, overlapping)
    export as one row per step; `load_episodes` reads that back as episodes."""
    source = _checkpoint(tmp_path / "ckpt")
    out = tmp_path / "out"
    assert cli.main(["export", source, "--to", str(out), "--batch-rows", "3"]) == 0
    printed = capsys.readouterr().out
    assert "frames.parquet: 7 steps (episodes reassembled)" in printed
    assert "plain.parquet: 5 steps (episodes reassembled)" in printed
    with reverb.checkpoint.open(source) as ckpt:
        items = list(ckpt.items("frames"))
    # The step each item ends at (its label's, the first column in `tf.nest` order) holds
    # that step's obs (its last row) and label.
    by_step = {item.spans[0][1]: item for item in items}
    table = pq.read_table(out / "frames.parquet")
    assert table.schema.metadata[b"reverb.rows"] == b"steps"
    rows = table.to_pylist()
    assert [r["step"] for r in rows] == list(range(7))
    assert {r["episode_id"] for r in rows} == {items[0].episode_id}
    columns = table.column_names[2:]
    for row in rows:
        item = by_step[row["step"]]
        label, obs = (row[c] for c in columns)
        assert label == item.data[0].item()
        np.testing.assert_array_equal(np.array(obs, np.uint8), item.data[1][-1])
    # Each insert of `plain` is an episode of one step.
    plain = pq.read_table(out / "plain.parquet").to_pylist()
    assert [r["step"] for r in plain] == [0] * 5 and len({r["episode_id"] for r in plain}) == 5
    assert [r["column_0"] for r in plain] == [0.0, 0.5, 1.0, 1.5, 2.0]

    # Back into a table (an item per step, its obs a one-step slice as the signature asks)
    # with `load_episodes`: the steps come back in order.
    from reverb import parquet, structured_writer

    tf = pytest.importorskip("tensorflow")
    step = {"label": tf.TensorSpec([], tf.string), "obs": tf.TensorSpec([4, 3], tf.uint8)}
    pattern = structured_writer.pattern_from_transform(
        step, lambda s: {"obs": s["obs"][-1:], "label": s["label"][-1]}
    )
    server = _tables(tmp_path / "fresh")
    try:
        loaded = parquet.load_episodes(
            server.localhost_client(),
            str(out / "frames.parquet"),
            episode_column="episode_id",
            step_column="step",
            configs=[structured_writer.create_config(pattern, "frames")],
            timeout=T,
        )
        assert loaded == (1, 7)
        # `reverb import` of a file of steps loads its episodes, an item per step.
        plain = str(out / "plain.parquet")
        assert cli.main(["import", plain, "--to", f"localhost:{server.port}"]) == 0
        assert "5 episodes, 5 steps into" in capsys.readouterr().out
        with pytest.raises(ValueError, match="load_episodes"):
            parquet.load(server.localhost_client(), plain)
        copy = server.localhost_client().checkpoint(timeout=T)
    finally:
        server.stop()
    with reverb.checkpoint.open(copy) as ckpt:
        again = list(ckpt.items("frames", unpack_as_table_signature=True))
    assert len(again) == 7
    for t, item in enumerate(again):
        assert item.data["label"].item() == by_step[t].data[0].item()
        np.testing.assert_array_equal(item.data["obs"], by_step[t].data[1][-1:])
    with reverb.checkpoint.open(copy) as ckpt:
        assert [i.data[0].item() for i in ckpt.items("plain")] == [0.0, 0.5, 1.0, 1.5, 2.0]


def test_items_that_leave_gaps_are_exported_as_items(tmp_path: pathlib.Path, capsys) -> None:
    server = reverb.Server([reverb.Table.queue("gaps", 10)])
    client = server.localhost_client()
    with client.trajectory_writer(2) as w:
        for t in range(6):
            w.append({"x": np.float32(t)})
            if t in (1, 5):  # steps 0-1 and 4-5: 2 and 3 are in no item
                w.create_item("gaps", 1.0, {"x": w.history["x"][-2:]})
        w.end_episode(timeout_ms=int(T * 1000))
    path = client.checkpoint(timeout=T)
    server.stop()
    out = tmp_path / "out"
    assert cli.main(["export", path, "--to", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "gaps.parquet: 2 items (not reassembled: episode" in printed
    assert "gaps" in printed
    assert pq.read_table(out / "gaps.parquet").schema.metadata[b"reverb.rows"] == b"items"
    assert cli.main(["export", path, "--to", str(out), "--rows", "steps"]) == 1
    assert "cannot be reassembled" in capsys.readouterr().err


def _one_episode(writer_items, columns: int = 1) -> str:
    """A checkpoint of a queue table holding one episode of 6 steps (`columns` float32
    columns, step t's value t + 100 * column), with the items `writer_items(history)`
    names (lists of trajectories)."""
    server = reverb.Server([reverb.Table.queue("t", 100)])
    client = server.localhost_client()
    with client.trajectory_writer(6) as w:
        for t in range(6):
            w.append([np.float32(t + 100 * c) for c in range(columns)])
        for trajectory in writer_items(w.history):
            w.create_item("t", 1.0, trajectory)
        w.end_episode(timeout_ms=int(T * 1000))
    path = client.checkpoint(timeout=T)
    server.stop()
    return path


def test_items_out_of_order_reassemble_and_strided_ones_do_not(tmp_path: pathlib.Path) -> None:
    from reverb import parquet

    # Steps 4-5, then 0-1, then 2-3: together the whole episode.
    path = _one_episode(lambda h: [[h[0][4:6]], [h[0][0:2]], [h[0][2:4]]])
    out = parquet.export(path, str(tmp_path / "a"))["t"]
    assert (out.rows, out.count) == ("steps", 6)
    rows = pq.read_table(out.path).to_pylist()
    assert [(r["step"], r["column_0"]) for r in rows] == [(t, float(t)) for t in range(6)]
    # Every other step: not consecutive steps, so items (and the reason).
    path = _one_episode(lambda h: [[h[0][0:6:2]], [h[0][0:3]]])
    out = parquet.export(path, str(tmp_path / "b"))["t"]
    assert out.rows == "items" and "do not follow each other" in out.why_items
    with pytest.raises(ValueError, match="cannot be reassembled"):
        parquet.export(path, str(tmp_path / "c"), rows="steps")


def test_steps_come_back_in_their_columns_order(tmp_path: pathlib.Path) -> None:
    """11 columns without a signature (`column_10` sorts before `column_2` by name): a file
    of steps loads back with every value in its own column."""
    from reverb import parquet

    path = _one_episode(lambda h: [[c[-1] for c in h]], columns=11)
    out = parquet.export(path, str(tmp_path / "out"))["t"]
    assert out.rows == "steps" and out.count == 1
    server = reverb.Server([reverb.Table.queue("t", 100)])
    try:
        loaded = parquet.load_episodes(server.localhost_client(), out.path)
        assert loaded == (1, 1)
        (sample,) = server.localhost_client().sample("t", 1, emit_timesteps=False, timeout=T)
        assert [float(v) for v in sample.data] == [5.0 + 100 * c for c in range(11)]
    finally:
        server.stop()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 5)), min_size=1, max_size=12))
def test_runs_of_steps_merge_whatever_the_order(spans) -> None:
    """`_cover` keeps the steps items hold as sorted, disjoint runs (what reassembly checks
    for gaps), whatever order the items come in."""
    from reverb.parquet import _cover

    runs: list = []
    steps: set = set()
    for first, length in spans:
        _cover(runs, first, first + length)
        steps |= set(range(first, first + length))
    expected: list = []
    for step in sorted(steps):
        if expected and expected[-1][1] == step:
            expected[-1][1] = step + 1
        else:
            expected.append([step, step + 1])
    assert runs == expected
