"""Exports a checkpoint's tables to Apache Parquet, item by item, for pandas, polars, DuckDB
or Hugging Face `datasets`:

    reverb.parquet.export("/data/replay", "/data/replay-parquet")  # one file per table
    # or: reverb export /data/replay --to /data/replay-parquet [--table replay]

One row per item, in insertion order: `key` (uint64), `priority` (float64), `times_sampled`
(int32), `inserted_at` (timestamp, UTC), `episode_id` (uint64) and `step` (int64, of the
item's first row), then one column per trajectory column, named by the table signature's
tensor names (`column_<i>` without a signature, or where names repeat). A tensor column
holds the item's rows as a list (items of one table may differ in length) of fixed-size
lists for the other dimensions; a column the item took from one step (squeezed) holds that
step's value the same way; scalars are plain values, strings binary. The file's schema
metadata names the table and says `reverb.rows = items`: episodes are exported as the items
that hold them, not reassembled. Reads the checkpoint in bounded memory (see
`reverb.checkpoint`), writing `batch_rows` items at a time. Needs pyarrow (`pip install
'dm-reverb[parquet]'`). Not in the reference.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence

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


def _names(table: checkpoint.CheckpointTable, count: int) -> List[str]:
    """Column names: the signature's tensor names when there is one and they are usable."""
    names = list(table.column_names or [])
    usable = len(names) == count and all(names) and len(set(names)) == count
    if usable and not set(names) & set(META_COLUMNS):
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


def export_table(
    ckpt: checkpoint.Checkpoint, table: str, path: str, *, batch_rows: int = 1024
) -> int:
    """Writes `table`'s items to the Parquet file `path`; returns how many."""
    pa, pq = _pyarrow()
    info = ckpt.tables[table]
    writer = None
    names: List[str] = []
    first: List[np.ndarray] = []
    squeezed: tuple = ()
    count = 0
    pending: List[checkpoint.CheckpointItem] = []
    # Written under another name and renamed once complete: a failed export leaves no file
    # that looks whole.
    partial = f"{path}.partial"

    def flush() -> None:
        nonlocal writer
        if not pending:
            return
        batch = _batch(pa, pending, names, first)
        if writer is None:
            metadata = {
                "reverb.table": table,
                "reverb.rows": "items",
                "reverb.columns": json.dumps(names),
                "reverb.squeezed": json.dumps(list(squeezed)),
            }
            schema = batch.schema.with_metadata(metadata)
            writer = pq.ParquetWriter(partial, schema)
        writer.write_batch(batch)
        pending.clear()

    ok = False
    try:
        for item in ckpt.items(table):
            if not names:
                names = _names(info, len(item.data))
                first = [np.asarray(column) for column in item.data]
                squeezed = item.squeezed
            elif item.squeezed != squeezed:
                raise ValueError(
                    f"items of table {table!r} differ in which columns are single steps "
                    f"({squeezed} and, for item {item.key}, {item.squeezed}): they cannot "
                    "share one Parquet file"
                )
            pending.append(item)
            count += 1
            if len(pending) >= batch_rows:
                flush()
        flush()
        ok = True
    finally:
        if writer is not None:
            writer.close()
            if ok:
                os.replace(partial, path)
            else:
                os.unlink(partial)
    if writer is None:  # no items: an empty file with the item columns only
        metadata = {"reverb.table": table, "reverb.rows": "items"}
        schema = pa.schema(_meta_fields(pa), metadata=metadata)
        pq.write_table(schema.empty_table(), path)
    return count


def export(
    source: str, out_dir: str, tables: Optional[Sequence[str]] = None, *, batch_rows: int = 1024
) -> Dict[str, str]:
    """Exports the checkpoint at `source` (see `reverb.checkpoint.open`): each table (or those
    named) to `out_dir/<table>.parquet`. Returns the files written, by table."""
    os.makedirs(out_dir, exist_ok=True)
    written = {}
    with checkpoint.open(source) as ckpt:
        for name in tables or list(ckpt.tables):
            if name not in ckpt.tables:
                raise KeyError(f"no table {name!r} in {ckpt.path} (it has {sorted(ckpt.tables)})")
            path = os.path.join(out_dir, f"{name}.parquet")
            export_table(ckpt, name, path, batch_rows=batch_rows)
            written[name] = path
    return written


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


__all__ = ["META_COLUMNS", "export", "export_table", "load"]
