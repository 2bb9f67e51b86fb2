"""Exports a checkpoint's tables as RLDS datasets: TFDS datasets whose examples are episodes,
each a nested dataset of steps, as RLDS and TFDS tools read them:

    reverb.rlds.export("/data/replay", "/data/replay-rlds")
    # or: reverb export /data/replay --to /data/replay-rlds --format rlds
    ds = tfds.builder_from_directory("/data/replay-rlds/replay/1.0.0").as_dataset(split="train")

A table's episodes are reassembled from its items as `reverb export` does for Parquet (see
`reverb.parquet.episode_spans`; a table whose items do not hold every step of their episodes
cannot be exported this way). A step holds the trajectory columns by the table signature's
names, nested where the names are (`observation/pixels` becomes `step["observation"]
["pixels"]`; `column_<i>` without a signature), and RLDS's `is_first` and `is_last`;
`is_terminal` is False throughout, since a replay does not record whether an episode ended
in a terminal state. An episode's metadata is its `episode_id` and `first_step` (0 unless the
table had already removed its first steps). Needs TensorFlow and TensorFlow Datasets (`pip
install 'dm-reverb[rlds]'`). Not in the reference.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from reverb import checkpoint, parquet

#: The RLDS step fields this export sets itself.
RLDS_FIELDS = ("is_first", "is_last", "is_terminal")
VERSION = "1.0.0"


def _tfds() -> Any:
    try:
        import tensorflow_datasets as tfds
        from tensorflow_datasets.core import SequentialWriter, dataset_info
        from tensorflow_datasets.rlds import rlds_base
    except ImportError:
        raise ImportError(
            "exporting RLDS needs TensorFlow Datasets: pip install 'dm-reverb[rlds]'"
        ) from None
    return tfds, SequentialWriter, dataset_info, rlds_base


def _paths(ckpt: checkpoint.Checkpoint, table: str, count: int) -> List[List[str]]:
    """Each column's path in the step (the signature's names split at `/`)."""
    names = parquet.signature_names(ckpt.tables[table], count)
    names = names or [f"column_{i}" for i in range(count)]
    paths = [name.split("/") for name in names]
    for path in paths:
        if path[0] in RLDS_FIELDS:
            raise ValueError(
                f"table {table!r}: a column named {path[0]!r} would hide RLDS's own field"
            )
    for a in paths:  # a name that is a prefix of another cannot be both a leaf and a dict
        if any(b != a and b[: len(a)] == a for b in paths):
            raise ValueError(f"table {table!r}: column {'/'.join(a)!r} is also a dict")
    return paths


def _nest(paths: List[List[str]], leaves: Sequence[Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for path, leaf in zip(paths, leaves):
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = leaf
    return out


def export_table(
    ckpt: checkpoint.Checkpoint,
    table: str,
    path: str,
    episodes: Dict[int, tuple],
    *,
    shard_episodes: int = 1000,
) -> int:
    """Writes `table`'s episodes (`episodes`: what `reverb.parquet.episode_spans` found) as
    an RLDS dataset in the directory `path` (`shard_episodes` episodes per file); returns
    how many. Written under another name and renamed once complete."""
    tfds, sequential_writer, dataset_info, rlds_base = _tfds()
    partial = f"{path}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    name = re.sub(r"\W", "_", table).lower() or "replay"
    writer = None
    count = 0
    ok = False
    try:
        for episode, first, steps in parquet.reassembled(ckpt, table, episodes):
            if writer is None:
                paths = _paths(ckpt, table, len(steps[0]))
                features = [
                    tfds.features.Tensor(
                        shape=np.shape(v),
                        dtype=np.object_ if np.asarray(v).dtype.kind in "OSU" else v.dtype,
                    )
                    for v in (np.asarray(v) for v in steps[0])
                ]
                config = rlds_base.DatasetConfig(
                    name=name,
                    description=f"The episodes of the Reverb table {table!r}.",
                    step_metadata_info=_nest(paths, features),
                    episode_metadata_info={
                        "episode_id": tfds.features.Tensor(shape=(), dtype=np.uint64),
                        "first_step": tfds.features.Tensor(shape=(), dtype=np.int64),
                    },
                )
                identity = dataset_info.DatasetIdentity(
                    name=name, data_dir=partial, module_name="", version=VERSION
                )
                info = rlds_base.build_info(config, builder=identity)
                writer = sequential_writer(ds_info=info, max_examples_per_shard=shard_episodes)
                writer.initialize_splits(["train"])
            last = len(steps) - 1
            example = {
                "steps": [
                    {
                        **_nest(paths, values),
                        "is_first": k == 0,
                        "is_last": k == last,
                        "is_terminal": False,
                    }
                    for k, values in enumerate(steps)
                ],
                "episode_id": np.uint64(episode),
                "first_step": np.int64(first),
            }
            writer.add_examples({"train": [example]})
            count += 1
        if writer is None:
            raise ValueError(f"table {table!r} has no episodes")
        writer.close_splits(["train"])
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        os.replace(partial, path)
        ok = True
    finally:
        if not ok:
            shutil.rmtree(partial, ignore_errors=True)
    return count


def export(
    source: str,
    out_dir: str,
    tables: Optional[Sequence[str]] = None,
    *,
    shard_episodes: int = 1000,
) -> Dict[str, parquet.Exported]:
    """Exports the checkpoint at `source` (see `reverb.checkpoint.open`): each table (or those
    named) as an RLDS dataset in `out_dir/<table>/1.0.0`; an empty table is skipped (its
    entry says so, nothing written). ValueError for a table whose episodes cannot be
    reassembled. Returns what was written (rows "episodes"), by table."""
    _tfds()
    written = {}
    with checkpoint.open(source) as ckpt:
        for name in tables or list(ckpt.tables):
            if name not in ckpt.tables:
                raise KeyError(f"no table {name!r} in {ckpt.path} (it has {sorted(ckpt.tables)})")
            path = os.path.join(out_dir, name, VERSION)
            if ckpt.tables[name].num_items == 0:
                written[name] = parquet.Exported(path, "episodes", 0, "the table is empty")
                continue
            episodes = parquet.episode_spans(ckpt, name)
            if isinstance(episodes, str):
                raise ValueError(
                    f"table {name!r}: RLDS holds episodes, and they cannot be reassembled "
                    f"from its items: {episodes}"
                )
            count = export_table(ckpt, name, path, episodes, shard_episodes=shard_episodes)
            written[name] = parquet.Exported(path, "episodes", count)
    return written


__all__ = ["RLDS_FIELDS", "VERSION", "export", "export_table"]
