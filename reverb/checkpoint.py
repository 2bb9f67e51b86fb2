"""Reads a checkpoint without a server: its tables, and its items with their data.

    import reverb

    with reverb.checkpoint.open("/tmp/reverb/checkpoints") as ckpt:  # the latest one there
        for name, table in ckpt.tables.items():
            print(name, table.num_items, table.max_size, table.signature)
        for item in ckpt.items("replay"):
            item.key, item.priority, item.times_sampled, item.inserted_at, item.episode_id
            item.data  # the trajectory: a list of numpy arrays, one per column

Not in the reference. Opening reads the file once, checking every record's checksum (a
truncated or corrupt checkpoint is refused with a `ValueError` naming the file); after that
it keeps only the tables' settings and an index of where chunks and items are, so a
checkpoint larger than memory is read item by item, each chunk fetched from the file when an
item needs it. Reads the checkpoints of this package (`Client.checkpoint`, a server's
`DefaultCheckpointer`) that way; dm-reverb 0.14's (a directory of TFRecord files) are first
converted into an unlinked temporary file of ours under `TMPDIR`, every record's checksums
checked.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Any, Dict, Iterator, List, Optional, Tuple

from reverb import _native, _proto, _signature
from reverb.client import to_sample

#: The file a checkpoint directory holds.
FILE = "checkpoint.rvb"


@dataclasses.dataclass(frozen=True)
class CheckpointTable:
    """A table as the checkpoint saved it."""

    name: str
    sampler_options: Any  # KeyDistributionOptions proto
    remover_options: Any  # KeyDistributionOptions proto
    max_size: int
    max_times_sampled: int
    #: RateLimiterCheckpoint proto: samples_per_insert, min_diff, max_diff,
    #: min_size_to_sample and the insert, sample and delete counts.
    rate_limiter: Any
    #: The signature as a nest of `tf.TensorSpec` (None without one, or without TensorFlow).
    signature: Any
    #: The names of the signature's tensors in `tf.nest` order (None without a signature;
    #: read without TensorFlow).
    column_names: Optional[List[str]]
    num_items: int
    num_deleted_episodes: int
    num_unique_samples: int


@dataclasses.dataclass(frozen=True)
class CheckpointItem:
    """An item as the checkpoint saved it."""

    key: int
    priority: float
    times_sampled: int
    #: When the table stored it (UTC; None when the checkpoint does not say).
    inserted_at: Optional[datetime.datetime]
    #: The episode and step of the item's first row (of its first column).
    episode_id: int
    step: int
    #: Per column: whether the item took it from one step, without a time dimension
    #: (`history[c][-1]` rather than a slice).
    squeezed: Tuple[bool, ...]
    #: Per column: the episode and step of its first row, and how many rows it has (1 for
    #: a squeezed column): which steps of which episode the item holds.
    spans: Tuple[Tuple[int, int, int], ...]
    #: The trajectory: a list of numpy arrays (one per column), or the table signature's
    #: nest with `unpack_as_table_signature`; None when items were read with `data=False`.
    data: Any


def _is_dm_reverb(path: str) -> bool:
    """A complete checkpoint directory dm-reverb wrote (TFRecord files and DONE)."""
    return os.path.isfile(os.path.join(path, "DONE")) and any(
        name.endswith(".tfrecord") for name in os.listdir(path)
    )


def _resolve(path: str) -> str:
    """What `path` names: our checkpoint file (the file, or a checkpoint directory holding
    it), a dm-reverb checkpoint directory, or a root of checkpoint directories (the latest
    one there: ours by their UTC names, else dm-reverb's by theirs)."""
    path = os.fspath(path)
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        raise ValueError(f"{path}: no such checkpoint file or directory")
    if os.path.isfile(os.path.join(path, FILE)):
        return os.path.join(path, FILE)
    if _is_dm_reverb(path):
        return path
    if os.path.isfile(os.path.join(path, "tables.tfrecord")):
        raise ValueError(
            f"{path}: a dm-reverb checkpoint without its DONE marker (dm-reverb did not "
            "finish writing it)"
        )
    subdirs = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))
    ours = [d for d in subdirs if os.path.isfile(os.path.join(path, d, FILE))]
    if ours:
        return os.path.join(path, ours[-1], FILE)
    theirs = [d for d in subdirs if _is_dm_reverb(os.path.join(path, d))]
    if theirs:
        return os.path.join(path, theirs[-1])
    raise ValueError(f"{path}: no checkpoint ({FILE}, or dm-reverb's) in it or below it")


def _time(seconds: int, nanos: int) -> Optional[datetime.datetime]:
    if seconds == 0 and nanos == 0:
        return None
    at = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return at + datetime.timedelta(microseconds=nanos // 1000)


class Checkpoint:
    """An opened checkpoint (see `open`). Use it as a context manager, or `close()` it."""

    def __init__(self, path: str) -> None:
        self.path = _resolve(path)
        self._reader: Optional[_native.CheckpointReader] = _native.CheckpointReader(self.path)
        self.tables: Dict[str, CheckpointTable] = {}
        for header_bytes, count in self._reader.tables():
            header = _proto.PriorityTableCheckpoint.FromString(header_bytes)
            signature, names = None, None
            if header.HasField("signature"):
                encoded = header.signature.SerializeToString()
                signature = _signature.decode(encoded)
                flat = _native.table_signature(encoded)
                names = None if flat is None else [name for name, _, _ in flat.specs]
            self.tables[header.table_name] = CheckpointTable(
                name=header.table_name,
                sampler_options=header.sampler,
                remover_options=header.remover,
                max_size=header.max_size,
                max_times_sampled=header.max_times_sampled,
                rate_limiter=header.rate_limiter,
                signature=signature,
                column_names=names,
                num_items=count,
                num_deleted_episodes=header.num_deleted_episodes,
                num_unique_samples=header.num_unique_samples,
            )

    def items(
        self, table: str, *, data: bool = True, unpack_as_table_signature: bool = False
    ) -> Iterator[CheckpointItem]:
        """The items of `table` in insertion order (the order a FIFO remover deletes them).
        With `data=False` only their metadata is read (much faster)."""
        if self._reader is None:
            raise ValueError("the checkpoint is closed")
        if table not in self.tables:
            raise KeyError(f"no table {table!r} in {self.path} (it has {sorted(self.tables)})")
        signature = self.tables[table].signature if unpack_as_table_signature else None
        for entry in self._reader.items(table, data):
            key, priority, times_sampled, (secs, nanos), origin, squeezed, spans, columns = entry
            item_data: Any = None
            if columns is not None:
                item_data = to_sample(None, columns, False, signature).data
            yield CheckpointItem(
                key=key,
                priority=priority,
                times_sampled=times_sampled,
                inserted_at=_time(secs, nanos),
                episode_id=origin[0],
                step=origin[1],
                squeezed=tuple(squeezed),
                spans=tuple(spans),
                data=item_data,
            )

    def close(self) -> None:
        """Closes the checkpoint (the file itself once no `items` walk holds it)."""
        self._reader = None

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        sizes = ", ".join(f"{name}: {t.num_items} items" for name, t in self.tables.items())
        return f"<reverb.checkpoint.Checkpoint {self.path} ({sizes})>"


def open(path: str) -> Checkpoint:  # noqa: A001 (the name users call, as io.open)
    """Opens a checkpoint for reading without a server: `path` is a checkpoint directory
    (what `Client.checkpoint()` returns), its file, or a checkpointer's root directory (the
    latest checkpoint in it). Raises `ValueError` for a missing, truncated or corrupt one."""
    return Checkpoint(path)


__all__ = ["Checkpoint", "CheckpointItem", "CheckpointTable", "open"]
