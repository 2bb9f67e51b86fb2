"""`reverb export --format rlds` / `reverb.rlds.export`: a table's episodes, reassembled from
its items, become an RLDS dataset (TFDS format) that `tfds.builder_from_directory` reads: an
example per episode, its steps with the signature's nested names and RLDS's flags."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import reverb
from reverb import cli

tf = pytest.importorskip("tensorflow")
tfds = pytest.importorskip("tensorflow_datasets")

T = 10.0
LENGTHS = [4, 6]

pytestmark = pytest.mark.slow


def _checkpoint(root: pathlib.Path) -> tuple:
    """Two episodes written as windows of up to 2 steps (overlapping items) into `replay`
    (a nested signature), and one item leaving gaps in `gaps`; returns the checkpoint and
    the steps written."""
    signature = {
        "observation": {
            "pixels": tf.TensorSpec([None, 4, 3], tf.uint8),
            "state": tf.TensorSpec([None, 2], tf.float32),
        },
        "action": tf.TensorSpec([None], tf.int32),
        "label": tf.TensorSpec([None], tf.string),
    }
    tables = [
        reverb.Table.queue("replay", 100, signature=signature),
        reverb.Table.queue("gaps", 100),
    ]
    server = reverb.Server(tables, checkpointer=reverb.checkpointers.DefaultCheckpointer(str(root)))
    client = server.localhost_client()
    rng = np.random.default_rng(0)
    written = []
    for length in LENGTHS:
        steps = []
        with client.trajectory_writer(2) as w:
            for t in range(length):
                step = {
                    "observation": {
                        "pixels": rng.integers(0, 255, (4, 3), dtype=np.uint8),
                        "state": rng.random(2, dtype=np.float32),
                    },
                    "action": np.int32(t),
                    "label": f"step {t}".encode(),
                }
                steps.append(step)
                w.append(step)
                n = min(t + 1, 2)
                window = tf.nest.map_structure(lambda c, n=n: c[-n:], w.history)
                w.create_item("replay", 1.0, window)
                if t in (1, 3):  # steps 1 and 3 of an episode: step 2 is in no item
                    w.create_item("gaps", 1.0, {"a": w.history["action"][-1]})
            w.end_episode(timeout_ms=int(T * 1000))
        written.append(steps)
    path = client.checkpoint(timeout=T)
    server.stop()
    return path, written


def test_episodes_become_an_rlds_dataset(tmp_path: pathlib.Path, capsys) -> None:
    path, written = _checkpoint(tmp_path / "ckpt")
    out = tmp_path / "rlds"
    argv = ["export", path, "--to", str(out), "--format", "rlds", "--table"]
    assert cli.main([*argv, "replay"]) == 0
    assert "replay/1.0.0: 2 episodes (RLDS)" in capsys.readouterr().out
    builder = tfds.builder_from_directory(str(out / "replay" / "1.0.0"))
    episodes = list(tfds.as_numpy(builder.as_dataset(split="train")))
    assert len(episodes) == len(LENGTHS)
    for episode, steps in zip(episodes, written):
        assert episode["first_step"] == 0
        got = list(episode["steps"])
        assert len(got) == len(steps)
        for k, (step, want) in enumerate(zip(got, steps)):
            assert step["is_first"] == (k == 0) and step["is_last"] == (k == len(steps) - 1)
            assert not step["is_terminal"]
            assert step["action"] == want["action"] and step["label"] == want["label"]
            np.testing.assert_array_equal(
                step["observation"]["pixels"], want["observation"]["pixels"]
            )
            np.testing.assert_array_equal(
                step["observation"]["state"], want["observation"]["state"]
            )
    assert len({int(e["episode_id"]) for e in episodes}) == 2

    # A table whose items leave gaps has no episodes to export: a clear error, no dataset.
    assert cli.main([*argv, "gaps"]) == 1
    assert "cannot be reassembled" in capsys.readouterr().err
    assert not (out / "gaps").exists()
