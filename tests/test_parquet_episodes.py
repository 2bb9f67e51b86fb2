"""`reverb.parquet.load_episodes` / `reverb import --episodes`: a dataset of step rows (laid
out as LeRobot v3 writes one: `data/chunk-000/file-00N.parquet`, an episode and a frame
column, vector columns as lists, images as `{bytes, path}` structs) seeds a live table
episode by episode through a writer, with one item per step, windows of steps, or the items
of structured-writer patterns."""

from __future__ import annotations

import json
import pathlib
from typing import Dict, List

import numpy as np
import pytest

import reverb
from reverb import cli, parquet, structured_writer

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
tf = pytest.importorskip("tensorflow")

T = 10.0
LENGTHS = [5, 4, 6]  # steps of episodes 0, 1, 2
COLUMNS = {"observation": "observation.state", "action": "action", "reward": "next.reward"}

pytestmark = pytest.mark.slow


def _episodes() -> List[Dict[str, np.ndarray]]:
    """The dataset's steps, per episode, by their LeRobot column names."""
    rng = np.random.default_rng(0)
    out = []
    for length in LENGTHS:
        out.append(
            {
                "observation.state": rng.random((length, 3), dtype=np.float32),
                "action": rng.random((length, 2), dtype=np.float32),
                "next.reward": rng.random(length, dtype=np.float32),
                "next.done": np.arange(length) == length - 1,
                "observation.image": [bytes([i, 255, i]) for i in range(length)],
            }
        )
    return out


def _file(episodes: Dict[int, Dict[str, np.ndarray]], path: pathlib.Path) -> None:
    """One data file of LeRobot v3's layout holding `episodes` (index -> steps)."""
    columns: Dict[str, list] = {
        name: [] for name in ("episode_index", "frame_index", "index", "timestamp")
    }
    data: Dict[str, list] = {}
    for index, steps in episodes.items():
        n = len(steps["action"])
        columns["episode_index"] += [index] * n
        columns["frame_index"] += list(range(n))
        columns["index"] += list(range(n))
        columns["timestamp"] += [i / 30 for i in range(n)]
        for name, values in steps.items():
            data.setdefault(name, []).extend(list(values))
    fields = {
        # (HF datasets stores a fixed-length Sequence as a fixed-size list, another as a list.)
        "observation.state": pa.array(
            [list(v) for v in data["observation.state"]], pa.list_(pa.float32(), 3)
        ),
        "action": pa.array([list(v) for v in data["action"]], pa.list_(pa.float32())),
        "next.reward": pa.array(data["next.reward"], pa.float32()),
        "next.done": pa.array(data["next.done"], pa.bool_()),
        "observation.image": pa.array(
            [{"bytes": b, "path": None} for b in data["observation.image"]],
            pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
        ),
        "episode_index": pa.array(columns["episode_index"], pa.int64()),
        "frame_index": pa.array(columns["frame_index"], pa.int64()),
        "index": pa.array(columns["index"], pa.int64()),
        "timestamp": pa.array(columns["timestamp"], pa.float32()),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(fields), str(path), row_group_size=3)


def _dataset(root: pathlib.Path) -> List[Dict[str, np.ndarray]]:
    """A LeRobot-v3-shaped dataset under `root`: episodes 0 and 1 in the first file, 2 in
    the second; returns the episodes' steps."""
    episodes = _episodes()
    (root / "meta").mkdir(parents=True)
    (root / "meta" / "info.json").write_text(json.dumps({"codebase_version": "v3.0"}))
    _file({0: episodes[0], 1: episodes[1]}, root / "data" / "chunk-000" / "file-000.parquet")
    _file({2: episodes[2]}, root / "data" / "chunk-000" / "file-001.parquet")
    return episodes


def _server(signature: dict) -> reverb.Server:
    return reverb.Server([reverb.Table.queue("replay", 1000, signature=signature)])


STEP = {
    "observation": tf.TensorSpec([3], tf.float32),
    "action": tf.TensorSpec([2], tf.float32),
    "reward": tf.TensorSpec([], tf.float32),
}


def _items(server: reverb.Server) -> list:
    """The table's items (insertion order) as `reverb.checkpoint` reads them."""
    path = server.localhost_client().checkpoint(timeout=T)
    with reverb.checkpoint.open(path) as ckpt:
        return list(ckpt.items("replay", unpack_as_table_signature=True))


def test_one_item_per_step_episode_by_episode(tmp_path: pathlib.Path) -> None:
    episodes = _dataset(tmp_path / "ds")
    server = _server(STEP)
    try:
        loaded = parquet.load_episodes(
            server.localhost_client(), str(tmp_path / "ds"), "replay", columns=COLUMNS
        )
        assert loaded == parquet.LoadedEpisodes(3, sum(LENGTHS))
        items = _items(server)
    finally:
        server.stop()
    assert len(items) == sum(LENGTHS)
    expected = [(e, t) for e, n in enumerate(LENGTHS) for t in range(n)]
    # One writer episode per dataset episode, steps counted from 0 in each.
    episode_ids = [item.episode_id for item in items]
    assert len(set(episode_ids)) == 3
    assert [item.step for item in items] == [t for _, t in expected]
    for item, (e, t) in zip(items, expected):
        assert episode_ids.count(item.episode_id) == LENGTHS[e]
        for name, column in COLUMNS.items():
            got = item.data[name]
            want = episodes[e][column][t]
            assert got.dtype == np.float32 and got.shape == np.shape(want)
            np.testing.assert_array_equal(got, want)


def test_windows_and_patterns(tmp_path: pathlib.Path) -> None:
    episodes = _dataset(tmp_path / "ds")
    # Windows of 3 steps every 2 steps: an episode of L steps gives (L - 3) // 2 + 1 items.
    window = {name: tf.TensorSpec([3, *spec.shape], spec.dtype) for name, spec in STEP.items()}
    server = _server(window)
    try:
        client = server.localhost_client()
        parquet.load_episodes(
            client, str(tmp_path / "ds"), "replay", columns=COLUMNS, sequence_length=3, period=2
        )
        items = _items(server)
    finally:
        server.stop()
    starts = [(e, t) for e, n in enumerate(LENGTHS) for t in range(0, n - 2, 2)]
    assert len(items) == len(starts) == 5
    for item, (e, t) in zip(items, starts):
        np.testing.assert_array_equal(item.data["action"], episodes[e]["action"][t : t + 3])
        np.testing.assert_array_equal(item.data["reward"], episodes[e]["next.reward"][t : t + 3])

    # A structured writer's transitions (this step and the next observation), and the image
    # bytes as a string column; no transition spans two episodes.
    columns = {**COLUMNS, "image": "observation.image"}
    step_spec = {**STEP, "image": tf.TensorSpec([], tf.string)}
    transition = structured_writer.pattern_from_transform(
        step_spec,
        lambda s: {
            "observation": s["observation"][-2],
            "action": s["action"][-2],
            "image": s["image"][-2],
            "next_observation": s["observation"][-1],
        },
    )
    config = structured_writer.create_config(transition, "replay")
    signature = {
        "observation": STEP["observation"],
        "action": STEP["action"],
        "image": tf.TensorSpec([], tf.string),
        "next_observation": STEP["observation"],
    }
    server = _server(signature)
    try:
        client = server.localhost_client()
        loaded = parquet.load_episodes(
            client, str(tmp_path / "ds"), columns=columns, configs=[config]
        )
        assert loaded.steps == sum(LENGTHS)
        items = _items(server)
    finally:
        server.stop()
    pairs = [(e, t) for e, n in enumerate(LENGTHS) for t in range(n - 1)]
    assert len(items) == len(pairs)
    for item, (e, t) in zip(items, pairs):
        steps = episodes[e]
        np.testing.assert_array_equal(item.data["observation"], steps["observation.state"][t])
        np.testing.assert_array_equal(
            item.data["next_observation"], steps["observation.state"][t + 1]
        )
        assert item.data["image"].item() == steps["observation.image"][t]


def test_the_command_and_bad_datasets(tmp_path: pathlib.Path, capsys) -> None:
    _dataset(tmp_path / "ds")
    server = _server(STEP)
    address = f"localhost:{server.port}"
    try:
        argv = ["import", str(tmp_path / "ds"), "--episodes", "--to", address, "--table"]
        argv += ["replay", *[f"--column={k}={v}" for k, v in COLUMNS.items()]]
        assert cli.main(argv) == 0
        assert "3 episodes, 15 steps into" in capsys.readouterr().out
        client = server.localhost_client()
        assert client.server_info(timeout=T)["replay"].current_size == 15

        # A column the files lack, named.
        assert cli.main([*argv, "--column", "extra=observation.velocity"]) == 1
        assert "'observation.velocity'" in capsys.readouterr().err
        # A signature the steps do not fit (the action is float32[2]): refused, and what
        # the table held stays.
        with pytest.raises(Exception, match=r"float \[2\] tensor but got a int64 \[\]"):
            parquet.load_episodes(
                client, str(tmp_path / "ds"), "replay", columns={**COLUMNS, "action": "index"}
            )
        assert client.server_info(timeout=T)["replay"].current_size == 15
    finally:
        server.stop()

    # An episode whose rows are split by another's, and steps out of order.
    episodes = _episodes()
    split = tmp_path / "split.parquet"
    _file({0: episodes[0], 1: episodes[1]}, split)
    table = pq.read_table(str(split))
    order = list(range(2)) + list(range(5, 9)) + list(range(2, 5))  # 0 0 1 1 1 1 0 0 0
    pq.write_table(table.take(order), str(split))
    backwards = tmp_path / "backwards.parquet"
    pq.write_table(table.take([1, 0, 2, 3, 4]), str(backwards))
    server = _server(STEP)
    try:
        client = server.localhost_client()
        with pytest.raises(ValueError, match="episode 0 goes on after episode 1"):
            parquet.load_episodes(client, str(split), "replay", columns=COLUMNS)
        with pytest.raises(ValueError, match="step 0 after step 1"):
            parquet.load_episodes(client, str(backwards), "replay", columns=COLUMNS)
        with pytest.raises(ValueError, match="no such file"):
            parquet.load_episodes(client, str(tmp_path / "none"), "replay")
    finally:
        server.stop()


def test_images_without_bytes_and_options_without_episodes(tmp_path: pathlib.Path, capsys) -> None:
    path = tmp_path / "images.parquet"
    images = pa.array(
        [{"bytes": b"png", "path": None}, {"bytes": None, "path": "frame1.png"}],
        pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
    )
    table = pa.table({"episode_index": [0, 0], "frame_index": [0, 1], "image": images})
    pq.write_table(table, str(path))
    server = reverb.Server([reverb.Table.queue("replay", 10)])
    try:
        client = server.localhost_client()
        with pytest.raises(ValueError, match="1 images without their bytes"):
            parquet.load_episodes(client, str(path), "replay")
        assert client.server_info(timeout=T)["replay"].current_size == 0
        argv = ["import", str(path), "--to", f"localhost:{server.port}", "--table", "replay"]
        assert cli.main([*argv, "--column", "image=image"]) == 1
        assert "--column needs --episodes" in capsys.readouterr().err
        argv += ["--episodes", "--step-column", "t"]
        assert cli.main(argv) == 1
        assert "no step column 't'" in capsys.readouterr().err
    finally:
        server.stop()
