"""Exports a checkpoint's tables to Apache Parquet, for pandas, polars, DuckDB or Hugging
Face `datasets`, and seeds live tables from Parquet datasets:

    reverb.parquet.export("/data/replay", "/data/replay-parquet")  # one file per table
    # or: reverb export /data/replay --to /data/replay-parquet [--table replay]
    reverb.parquet.load_episodes(client, "/data/lerobot-dataset", "replay", columns=...)

A file's rows are either steps or items (its schema metadata says which: `reverb.rows`).
Steps (`export_steps`, where a table's items hold every step of their episodes): one row per
step of the reassembled episodes, `episode_id` (uint64) and `step` (int64), then one column
per trajectory column, a step's value (scalars plain, tensors fixed-size lists, strings
binary). Items (`export_table`): one row per item, in insertion order: `key` (uint64),
`priority` (float64), `times_sampled` (int32), `inserted_at` (timestamp, UTC), `episode_id`
(uint64) and `step` (int64, of the item's first row), then the trajectory columns, a tensor
column holding the item's rows as a list (items of one table may differ in length) of
fixed-size lists for the other dimensions; a column the item took from one step (squeezed)
holds that step's value the same way. Trajectory columns are named by the table signature's
tensor names (`column_<i>` without a signature, or where names repeat). Checkpoints are read
in bounded memory (see `reverb.checkpoint`), `batch_rows` rows written at a time. `load`
seeds a table with a file of items, `load_episodes` with a dataset of steps (ours, or
LeRobot v3's) through a writer. Needs pyarrow (`pip install 'dm-reverb[parquet]'`). Not in
the reference.
"""

from __future__ import annotations

import bisect
import json
import os
from typing import Any, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from reverb import checkpoint

#: The per-item columns before the trajectory's.
META_COLUMNS = ["key", "priority", "times_sampled", "inserted_at", "episode_id", "step"]


def _pyarrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(
            "exporting to Parquet needs pyarrow: pip install 'dm-reverb[parquet]'"
        ) from None
    return pa, pq


def signature_names(table: checkpoint.CheckpointTable, count: int) -> Optional[List[str]]:
    """The signature's names of `table`'s `count` trajectory columns (`a/b` for nested
    ones), when it has them and they name each column once; else None."""
    names = list(table.column_names or [])
    usable = len(names) == count and all(names) and len(set(names)) == count
    return names if usable else None


def _names(table: checkpoint.CheckpointTable, count: int) -> List[str]:
    """Column names: the signature's tensor names when there is one and they are usable."""
    names = signature_names(table, count)
    if names and not set(names) & set(META_COLUMNS):
        return [n.replace("/", ".") for n in names]
    return [f"column_{i}" for i in range(count)]


def _column(pa: Any, name: str, values: List[np.ndarray], first: np.ndarray) -> Any:
    """The Arrow array of one trajectory column over a batch of items, like the table's
    first item `first`: scalars plain, else a list over the first dimension of fixed-size
    lists over the others."""
    for v in values:
        if v.ndim != first.ndim or v.shape[1:] != first.shape[1:] or v.dtype != first.dtype:
            raise ValueError(
                f"column {name!r}: items of {first.dtype}{list(first.shape)} and "
                f"{v.dtype}{list(v.shape)} cannot share a Parquet column (only the first "
                "dimension may vary)"
            )
    first = first.shape
    strings = values[0].dtype == object or values[0].dtype.kind in "SU"
    leaf_type = pa.binary() if strings else None
    if not first:
        flat = [v.item() for v in values] if strings else np.stack(values)
        return pa.array(flat, type=leaf_type)
    flat = np.concatenate([v.reshape(-1) for v in values])
    array = pa.array(list(flat) if strings else flat, type=leaf_type)
    for size in reversed(first[1:]):
        array = pa.FixedSizeListArray.from_arrays(array, size)
    offsets = np.concatenate([[0], np.cumsum([len(v) for v in values])]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), array)


def _meta_fields(pa: Any) -> List[Any]:
    """The Arrow fields of `META_COLUMNS` (each an attribute of `CheckpointItem`)."""
    types = [
        pa.uint64(),
        pa.float64(),
        pa.int32(),
        pa.timestamp("us", tz="UTC"),
        pa.uint64(),
        pa.int64(),
    ]
    return [pa.field(name, t) for name, t in zip(META_COLUMNS, types)]


def _batch(pa: Any, items: List[checkpoint.CheckpointItem], names: List[str], first: list) -> Any:
    columns: Dict[str, Any] = {
        field.name: pa.array([getattr(i, field.name) for i in items], field.type)
        for field in _meta_fields(pa)
    }
    for c, name in enumerate(names):
        columns[name] = _column(pa, name, [np.asarray(i.data[c]) for i in items], first[c])
    return pa.record_batch(list(columns.values()), names=list(columns))


class _Batches:
    """Rows written to a Parquet file `batch_rows` at a time (`to_batch` makes a record
    batch of them; the first one's schema, with `metadata`, is the file's), under
    `path.partial` and renamed to `path` once whole: a failed export leaves no file that
    looks whole. `written` is whether any row was."""

    def __init__(self, pq: Any, path: str, batch_rows: int, to_batch: Any) -> None:
        self.pq, self.path, self.batch_rows, self.to_batch = pq, path, batch_rows, to_batch
        self.metadata: Dict[str, str] = {}
        self.pending: List[Any] = []
        self.writer: Any = None

    @property
    def written(self) -> bool:
        return self.writer is not None

    def add(self, row: Any) -> None:
        self.pending.append(row)
        if len(self.pending) >= self.batch_rows:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        batch = self.to_batch(self.pending)
        if self.writer is None:
            schema = batch.schema.with_metadata(self.metadata)
            self.writer = self.pq.ParquetWriter(f"{self.path}.partial", schema)
        self.writer.write_batch(batch)
        self.pending.clear()

    def __enter__(self) -> _Batches:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        whole = False
        try:
            if exc_type is None:
                self.flush()
                whole = True
        finally:
            if self.writer is not None:
                self.writer.close()
                if whole:
                    os.replace(f"{self.path}.partial", self.path)
                else:
                    os.unlink(f"{self.path}.partial")


def export_table(
    ckpt: checkpoint.Checkpoint, table: str, path: str, *, batch_rows: int = 1024
) -> int:
    """Writes `table`'s items to the Parquet file `path`; returns how many."""
    pa, pq = _pyarrow()
    info = ckpt.tables[table]
    names: List[str] = []
    first: List[np.ndarray] = []
    squeezed: tuple = ()
    count = 0

    def to_batch(items: List[checkpoint.CheckpointItem]) -> Any:
        return _batch(pa, items, names, first)

    with _Batches(pq, path, batch_rows, to_batch) as out:
        for item in ckpt.items(table):
            if not names:
                names[:] = _names(info, len(item.data))
                first[:] = [np.asarray(column) for column in item.data]
                squeezed = item.squeezed
                out.metadata = {
                    "reverb.table": table,
                    "reverb.rows": "items",
                    "reverb.columns": json.dumps(names),
                    "reverb.squeezed": json.dumps(list(squeezed)),
                }
            elif item.squeezed != squeezed:
                raise ValueError(
                    f"items of table {table!r} differ in which columns are single steps "
                    f"({squeezed} and, for item {item.key}, {item.squeezed}): they cannot "
                    "share one Parquet file"
                )
            out.add(item)
            count += 1
    if not out.written:  # no items: an empty file with the item columns only
        metadata = {"reverb.table": table, "reverb.rows": "items"}
        schema = pa.schema(_meta_fields(pa), metadata=metadata)
        pq.write_table(schema.empty_table(), path)
    return count


class Exported(NamedTuple):
    """A table `export` wrote: its file, what a row is (`"items"` or `"steps"`; `"episodes"`
    for `reverb.rlds.export`'s datasets), how many rows, and, for items, why episodes were
    not reassembled (None when not asked to)."""

    path: str
    rows: str
    count: int
    why_items: Optional[str] = None


def export(
    source: str,
    out_dir: str,
    tables: Optional[Sequence[str]] = None,
    *,
    batch_rows: int = 1024,
    rows: str = "auto",
) -> Dict[str, Exported]:
    """Exports the checkpoint at `source` (see `reverb.checkpoint.open`): each table (or those
    named) to `out_dir/<table>.parquet`, a row per item (`rows="items"`), per step of the
    reassembled episodes (`"steps"`: ValueError when a table's items do not allow it), or
    steps where the items allow it and items elsewhere (`"auto"`). Returns what was written,
    by table."""
    if rows not in ("items", "steps", "auto"):
        raise ValueError(f"rows must be 'items', 'steps' or 'auto'; got {rows!r}")
    os.makedirs(out_dir, exist_ok=True)
    written = {}
    with checkpoint.open(source) as ckpt:
        for name in tables or list(ckpt.tables):
            if name not in ckpt.tables:
                raise KeyError(f"no table {name!r} in {ckpt.path} (it has {sorted(ckpt.tables)})")
            path = os.path.join(out_dir, f"{name}.parquet")
            episodes: Any = None
            if rows != "items":
                episodes = episode_spans(ckpt, name)
                if isinstance(episodes, str) and rows == "steps":
                    raise ValueError(f"table {name!r}: episodes cannot be reassembled: {episodes}")
            if rows == "items" or isinstance(episodes, str):
                count = export_table(ckpt, name, path, batch_rows=batch_rows)
                written[name] = Exported(path, "items", count, episodes)
            else:
                count = export_steps(ckpt, name, path, episodes, batch_rows=batch_rows)
                written[name] = Exported(path, "steps", count)
    return written


#: The per-step columns before the trajectory's, in files of steps.
STEP_COLUMNS = ["episode_id", "step"]


def episode_spans(ckpt: checkpoint.Checkpoint, table: str) -> Any:
    """Whether `table`'s episodes can be reassembled from its items (reading metadata only):
    `{episode id: (first step, end step, index of its last item)}` when every column of
    every episode's items covers the same run of steps without gaps, else a string saying
    why not."""
    covered: Dict[int, List[List[List[int]]]] = {}  # episode -> per column its runs
    last: Dict[int, int] = {}
    count = 0
    for index, item in enumerate(ckpt.items(table, data=False)):
        count += 1
        episodes = {episode for episode, _, _ in item.spans}
        if len(episodes) != 1:
            return f"item {item.key} holds steps of {len(episodes)} episodes"
        (episode,) = episodes
        columns = covered.setdefault(episode, [[] for _ in item.spans])
        if len(columns) != len(item.spans):
            return f"items of episode {episode} differ in their number of columns"
        for runs, (_, first, length) in zip(columns, item.spans):
            if length < 0:
                return f"item {item.key} holds steps that do not follow each other"
            _cover(runs, first, first + length)
        last[episode] = index
    if not count:
        return "the table is empty"
    spans = {}
    for episode, columns in covered.items():
        if any(len(runs) != 1 for runs in columns):
            return f"episode {episode} has gaps between the steps its items hold"
        if any(runs != columns[0] for runs in columns):
            return f"the columns of episode {episode} hold different steps"
        ((first, end),) = columns[0]
        spans[episode] = (first, end, last[episode])
    return spans


def _cover(runs: List[List[int]], first: int, end: int) -> None:
    """Adds the steps `[first, end)` to `runs` (sorted, disjoint, not touching `[lo, hi)`
    runs), merging what they join. Items mostly come in step order: then the last run
    grows."""
    if runs and runs[-1][0] <= first <= runs[-1][1]:
        runs[-1][1] = max(runs[-1][1], end)
        return
    at = bisect.bisect_left(runs, [first, end])
    runs.insert(at, [first, end])
    # Merge it with the run before it and the runs after it that it reaches.
    i = max(at - 1, 0)
    while i + 1 < len(runs):
        if runs[i + 1][0] <= runs[i][1]:
            runs[i][1] = max(runs[i][1], runs[i + 1][1])
            del runs[i + 1]
        elif i < at:
            i += 1
        else:
            break


def _step_array(pa: Any, name: str, values: List[np.ndarray], first: np.ndarray) -> Any:
    """The Arrow array of one column over a batch of steps, each like `first`: scalars
    plain, tensors fixed-size lists (nested per dimension)."""
    for v in values:
        if v.shape != first.shape or v.dtype != first.dtype:
            raise ValueError(
                f"column {name!r}: steps of {first.dtype}{list(first.shape)} and "
                f"{v.dtype}{list(v.shape)} cannot share a Parquet column"
            )
    strings = first.dtype == object or first.dtype.kind in "SU"
    leaf_type = pa.binary() if strings else None
    flat = np.concatenate([v.reshape(-1) for v in values]) if values else np.array([])
    array = pa.array(list(flat) if strings else flat, type=leaf_type)
    for size in reversed(first.shape):
        array = pa.FixedSizeListArray.from_arrays(array, size)
    return array


def reassembled(
    ckpt: checkpoint.Checkpoint, table: str, episodes: Dict[int, tuple]
) -> Iterator[Tuple[int, int, List[list]]]:
    """The episodes of `table` (`episodes`: what `episode_spans` found) as `(episode id,
    first step, steps)`, each step a list of its values (one per trajectory column), in the
    order their last items were stored; a step several items hold comes once. Holds only
    the episodes still open at an item in memory."""
    open_steps: Dict[int, Dict[int, list]] = {}
    for index, item in enumerate(ckpt.items(table)):
        episode = item.spans[0][0]
        steps = open_steps.setdefault(episode, {})
        for c, ((_, start, length), squeezed) in enumerate(zip(item.spans, item.squeezed)):
            column = np.asarray(item.data[c])
            for k in range(length):
                row = steps.setdefault(start + k, [None] * len(item.spans))
                if row[c] is None:
                    row[c] = column if squeezed else column[k]
        first, end, last = episodes[episode]
        if last == index:
            yield episode, first, [steps[step] for step in range(first, end)]
            del open_steps[episode]


def step_names(ckpt: checkpoint.Checkpoint, table: str, count: int) -> List[str]:
    """The names of `table`'s `count` trajectory columns in files of steps."""
    names = _names(ckpt.tables[table], count)
    return names if not set(names) & set(STEP_COLUMNS) else [f"column_{i}" for i in range(count)]


def export_steps(
    ckpt: checkpoint.Checkpoint,
    table: str,
    path: str,
    episodes: Dict[int, tuple],
    *,
    batch_rows: int = 1024,
) -> int:
    """Writes the steps of `table`'s episodes (`episodes`: what `episode_spans` found) to the
    Parquet file `path`, a row per step: `episode_id` (uint64), `step` (int64), then the
    trajectory columns as the items hold them (a step's value: scalars plain, tensors
    fixed-size lists). Episodes are written whole (see `reassembled`), their steps in order.
    `load_episodes(client, path, table, episode_column="episode_id", step_column="step")`
    reads it back. Returns the steps."""
    pa, pq = _pyarrow()
    names: List[str] = []
    first: List[np.ndarray] = []
    count = 0

    def to_batch(rows: List[tuple]) -> Any:  # rows: (episode, step, values)
        columns = [
            pa.array([r[0] for r in rows], pa.uint64()),
            pa.array([r[1] for r in rows], pa.int64()),
        ]
        columns += [
            _step_array(pa, name, [r[2][c] for r in rows], first[c]) for c, name in enumerate(names)
        ]
        return pa.record_batch(columns, names=STEP_COLUMNS + names)

    with _Batches(pq, path, batch_rows, to_batch) as out:
        for episode, start, steps in reassembled(ckpt, table, episodes):
            if not names:
                names[:] = step_names(ckpt, table, len(steps[0]))
                first[:] = [np.asarray(v) for v in steps[0]]
                out.metadata = {
                    "reverb.table": table,
                    "reverb.rows": "steps",
                    "reverb.columns": json.dumps(names),
                }
            for k, values in enumerate(steps):
                out.add((episode, start + k, values))
                count += 1
    return count


def _scalar(value: Any, dtype: np.dtype) -> np.ndarray:
    """A 0-d array of `value`; bytes stay whole in an object array (numpy's `S` arrays drop
    trailing NUL bytes)."""
    if dtype.kind == "O":
        out = np.empty((), object)
        out[()] = value
        return out
    return np.asarray(value, dtype)


def _rows(pa: Any, array: Any) -> List[np.ndarray]:
    """One Arrow column of a batch as one array per row: lists over the first dimension of
    fixed-size lists become arrays of shape [length, *sizes]; scalars 0-d arrays."""
    lengths = None
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        lengths = array.value_lengths().to_numpy(zero_copy_only=False)
        array = array.flatten()
    dims = []
    while pa.types.is_fixed_size_list(array.type):
        dims.append(array.type.list_size)
        array = array.flatten()
    leaf = array.to_numpy(zero_copy_only=False)
    if lengths is None:
        if not dims:
            return [_scalar(v, leaf.dtype) for v in leaf]
        return list(leaf.reshape(-1, *dims))
    shaped = leaf.reshape(-1, *dims)
    return np.split(shaped, np.cumsum(lengths)[:-1]) if len(lengths) else []


def load(
    client: Any,
    path: str,
    table: Optional[str] = None,
    *,
    batch_rows: int = 1024,
    timeout: Optional[float] = None,
) -> int:
    """Seeds `table` (by default the one the file's metadata names) with the items of a
    Parquet file `export` wrote, or any file of item rows with the same layout: each row
    becomes a new item with the row's `priority` (1.0 when there is none) and its trajectory
    columns, written through a trajectory writer (checked against the table's signature as
    any writer's items are). Columns the file's `reverb.squeezed` metadata names are single
    steps (without it: scalar columns are, list columns are time slices). Items get new keys
    and start unsampled; the rows of overlapping items are stored once per item. Returns how
    many items were written."""
    pa, pq = _pyarrow()
    file = pq.ParquetFile(path)
    schema = file.schema_arrow
    metadata = schema.metadata or {}
    if holds_steps(path):
        raise ValueError(
            f"{path} holds the steps of episodes, not items: load it with load_episodes "
            "(reverb import --episodes)"
        )
    target = table or metadata.get(b"reverb.table", b"").decode()
    if not target:
        raise ValueError(f"{path} does not name its table: pass table=")
    names = [name for name in schema.names if name not in META_COLUMNS]
    if not names:
        if file.metadata.num_rows == 0:
            return 0  # (an exported empty table)
        raise ValueError(f"{path} has no trajectory columns (only {schema.names})")
    if b"reverb.squeezed" in metadata:
        squeezed = [bool(s) for s in json.loads(metadata[b"reverb.squeezed"])]
    else:
        squeezed = [not pa.types.is_list(schema.field(n).type) for n in names]
    timeout_ms = None if timeout is None else int(timeout * 1000)
    count = 0
    for batch in file.iter_batches(batch_size=batch_rows):
        columns = [_rows(pa, batch.column(name)) for name in names]
        if "priority" in batch.schema.names:
            priorities = batch.column("priority").to_numpy(zero_copy_only=False)
        else:
            priorities = np.ones(batch.num_rows)
        lengths = [
            [1 if squeezed[c] else len(columns[c][r]) for c in range(len(names))]
            for r in range(batch.num_rows)
        ]
        for r, row in enumerate(lengths):
            if min(row) == 0:
                column = names[row.index(0)]
                raise ValueError(f"{path}: row {count + r} has no rows in column {column!r}")
        longest = max((max(row) for row in lengths), default=1)
        with client.trajectory_writer(num_keep_alive_refs=max(longest, 1)) as writer:
            for r in range(batch.num_rows):
                steps = max(lengths[r])
                for k in range(steps):
                    step = {}
                    for c, name in enumerate(names):
                        first = steps - lengths[r][c]
                        if k < first:
                            step[name] = None
                        elif squeezed[c]:
                            step[name] = columns[c][r]
                        else:
                            step[name] = columns[c][r][k - first]
                    writer.append(step)
                trajectory = [
                    writer.history[name][-1]
                    if squeezed[c]
                    else writer.history[name][-lengths[r][c] :]
                    for c, name in enumerate(names)
                ]
                writer.create_item(target, float(priorities[r]), trajectory)
                count += 1
            writer.flush(timeout_ms=timeout_ms)
    return count


def holds_steps(path: str) -> bool:
    """Whether `path` is a Parquet file of steps `export_steps` wrote."""
    _, pq = _pyarrow()
    return (pq.read_schema(path).metadata or {}).get(b"reverb.rows") == b"steps"


class LoadedEpisodes(NamedTuple):
    """What `load_episodes` wrote: episodes and their steps."""

    episodes: int
    steps: int


def episode_files(path: str) -> List[str]:
    """The Parquet files of an episode dataset at `path`: the file itself, or a directory's
    files in name order (a LeRobot v3 dataset's root: those under its `data/`)."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise ValueError(f"{path}: no such file or directory")
    root = os.path.join(path, "data") if os.path.isdir(os.path.join(path, "data")) else path
    files = sorted(
        os.path.join(folder, name)
        for folder, _, names in os.walk(root)
        for name in names
        if name.endswith(".parquet")
    )
    if not files:
        raise ValueError(f"{path}: no .parquet files")
    return files


def _step_column(pa: Any, where: str, array: Any) -> np.ndarray:
    """One Arrow column of step rows as an array [rows, *shape]: lists (of one length) and
    fixed-size lists are dimensions; an image struct (LeRobot's `{bytes, path}`) its encoded
    bytes; strings and binaries objects of bytes."""
    if array.null_count:
        raise ValueError(f"{where}: {array.null_count} empty (null) values")
    rows = len(array)
    dims: List[int] = []
    while True:
        kind = array.type
        if pa.types.is_fixed_size_list(kind):
            dims.append(kind.list_size)
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
            lengths = array.value_lengths().to_numpy(zero_copy_only=False)
            if len(lengths) and (lengths != lengths[0]).any():
                raise ValueError(
                    f"{where}: rows hold lists of {lengths.min()} to {lengths.max()} values; "
                    "a step's value must have one shape"
                )
            dims.append(int(lengths[0]) if len(lengths) else 0)
        elif pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:
            array = array.field("bytes")
            if array.null_count:
                raise ValueError(
                    f"{where}: {array.null_count} images without their bytes (a path only: "
                    "images stored beside the files are not read)"
                )
            continue
        else:
            break
        array = array.flatten()
        if array.null_count:
            raise ValueError(f"{where}: {array.null_count} empty (null) values")
    leaf = array.to_numpy(zero_copy_only=False)
    if leaf.dtype.kind in "OSU":
        leaf = np.array([v if isinstance(v, bytes) else str(v).encode() for v in leaf], object)
    return leaf.reshape(rows, *dims)


def load_episodes(
    client: Any,
    path: str,
    table: Optional[str] = None,
    *,
    columns: Optional[Mapping[str, str]] = None,
    episode_column: Optional[str] = None,
    step_column: Optional[str] = None,
    sequence_length: int = 1,
    period: int = 1,
    priority: float = 1.0,
    configs: Optional[Sequence[Any]] = None,
    batch_rows: int = 4096,
    timeout: Optional[float] = None,
) -> LoadedEpisodes:
    """Seeds `table` with the episodes of a Parquet dataset of step rows (one row per step,
    an episode column, the rows of an episode together and in step order): a LeRobot v3
    dataset's root (its `data/` files; video features are not in them), a directory of such
    files, or one file; `export_steps`' files too. The episode and step columns are
    `episode_index` and `frame_index` (LeRobot's), or `episode_id` and `step` in files
    `export_steps` wrote, unless named; `table` is, without configs, the one such a file
    names unless given. `columns` maps the step's field names to the file's columns (e.g.
    `{"observation": "observation.state", "action": "action", "reward": "next.reward"}`;
    default: every column but the episode and step columns, by their own names). Steps go
    through a normal writer, so the table's signature checks them, and each episode ends
    with `end_episode`: by default a trajectory writer makes an item of the last
    `sequence_length` steps (one step: the step itself, unbatched) every `period` steps;
    with `configs` (`reverb.structured_writer.create_config`, patterns over the step), a
    structured writer makes the items those describe (in the tables they name). A step
    column, when the file has it, must increase within an episode. Image structs arrive as
    their encoded bytes. A step of a file of ours (without `columns`) is appended as a list of
    its columns in the file's order, which is the table's flattened order (a dict of their
    names need not flatten to it); patterns in `configs` index it. Returns the episodes and
    steps written."""
    if sequence_length < 1 or period < 1:
        raise ValueError(
            f"sequence_length and period must be at least 1; got {sequence_length}, {period}"
        )
    pa, pq = _pyarrow()
    files = episode_files(path)
    metadata = pq.read_schema(files[0]).metadata or {}
    ours = metadata.get(b"reverb.rows") == b"steps"
    if episode_column is None:
        episode_column = "episode_id" if ours else "episode_index"
    step_required = step_column is not None
    if step_column is None:
        step_column = "step" if ours else "frame_index"
    # Our files list the columns in the table's flattened order (tf.nest's), which a dict
    # of their names need not flatten to: their steps are appended as lists in that order.
    as_list = ours and columns is None
    if configs is None and not table:
        table = metadata.get(b"reverb.table", b"").decode() if ours else None
        if not table:
            raise ValueError("load_episodes needs a table (or configs naming theirs)")
    timeout_ms = None if timeout is None else int(timeout * 1000)
    if configs is not None:
        writer = client.structured_writer(list(configs))
    else:
        writer = client.trajectory_writer(num_keep_alive_refs=sequence_length)
    names: Dict[str, str] = {}
    episodes = steps = 0
    seen: set = set()
    current: Any = None
    last_step: Any = None
    in_episode = 0
    with writer:
        for file in files:
            schema = pq.ParquetFile(file).schema_arrow
            wanted = (
                dict(columns)
                if columns is not None
                else {n: n for n in schema.names if n not in (episode_column, step_column)}
            )
            if not wanted:
                raise ValueError(f"{file}: no step columns besides {episode_column!r}")
            names = names or wanted
            if wanted != names:
                raise ValueError(f"{file}: columns {sorted(wanted)} differ from {sorted(names)}")
            missing = [c for c in [episode_column, *wanted.values()] if c not in schema.names]
            if missing:
                raise ValueError(f"{file}: no column {missing[0]!r} (it has {schema.names})")
            with_step = step_column in schema.names
            if step_required and not with_step:
                raise ValueError(f"{file}: no step column {step_column!r} (it has {schema.names})")
            read = [episode_column, *([step_column] if with_step else []), *wanted.values()]
            for batch in pq.ParquetFile(file).iter_batches(batch_size=batch_rows, columns=read):
                episode_ids = _step_column(pa, f"{file}: {episode_column!r}", batch.column(0))
                step_ids = batch.column(1).to_numpy(zero_copy_only=False) if with_step else None
                values = {
                    name: _step_column(pa, f"{file}: column {column!r}", batch[column])
                    for name, column in wanted.items()
                }
                for r in range(batch.num_rows):
                    episode = episode_ids[r].item()
                    if episode != current:
                        if current is not None:
                            writer.end_episode(timeout_ms=timeout_ms)
                            episodes += 1
                        if episode in seen:
                            raise ValueError(
                                f"{file}: episode {episode} goes on after episode {current}: "
                                "the rows of an episode must be together"
                            )
                        seen.add(episode)
                        current, last_step, in_episode = episode, None, 0
                    if step_ids is not None:
                        if last_step is not None and step_ids[r] <= last_step:
                            raise ValueError(
                                f"{file}: episode {episode}: step {step_ids[r]} after step "
                                f"{last_step}: an episode's rows must be in step order"
                            )
                        last_step = step_ids[r]
                    if as_list:
                        writer.append([column[r] for column in values.values()])
                    else:
                        writer.append({name: column[r] for name, column in values.items()})
                    in_episode += 1
                    steps += 1
                    if configs is None and in_episode >= sequence_length:
                        if (in_episode - sequence_length) % period == 0:
                            history = writer.history
                            n = sequence_length
                            fields = range(len(values)) if as_list else list(values)
                            cells = [history[f][-1] if n == 1 else history[f][-n:] for f in fields]
                            item = cells if as_list else dict(zip(fields, cells))
                            writer.create_item(table, priority, item)
        if current is not None:
            writer.end_episode(timeout_ms=timeout_ms)
            episodes += 1
        writer.flush(timeout_ms=timeout_ms)
    return LoadedEpisodes(episodes, steps)


__all__ = [
    "META_COLUMNS",
    "STEP_COLUMNS",
    "Exported",
    "LoadedEpisodes",
    "episode_spans",
    "export_steps",
    "episode_files",
    "export",
    "export_table",
    "holds_steps",
    "reassembled",
    "signature_names",
    "step_names",
    "load",
    "load_episodes",
]
