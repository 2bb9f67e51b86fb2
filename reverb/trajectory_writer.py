"""`TrajectoryWriter` and `TrajectoryColumn`: the write path actors call on every step.

The writer flattens each appended step once and hands the leaves to native code, which
copies rows into per-column chunks (no Python object per row), encodes full chunks and
streams chunks and items to the server in the background. `history` exposes the written
cells, and `create_item` builds an item from slices of that history.
"""

from __future__ import annotations

import collections.abc
import operator
from typing import Any, List, Optional, Tuple

from reverb import _dtypes, _native, _nest, errors

Path = Tuple[Any, ...]
# How long leaving a `with` block because of an exception waits for unconfirmed items.
_FLUSH_ON_ERROR_TIMEOUT_MS = 10_000


def flush_on_exit(flush: Any, exc_type: Any) -> None:
    """What a writer's `__exit__` flushes: everything when no exception propagates; nothing
    while a ReverbError propagates (as in the reference), or Ctrl-C / SystemExit; while
    another exception propagates, what a bounded flush manages (it must not turn an error
    into a hang), any error of it dropped: the propagating exception is the one to report."""
    if exc_type is None:
        flush()
    elif issubclass(exc_type, Exception) and not issubclass(exc_type, errors.ReverbError):
        try:
            flush(timeout_ms=_FLUSH_ON_ERROR_TIMEOUT_MS)
        except Exception:  # noqa: BLE001 - a refusal (ValueError, NotFoundError) too
            pass


# A column of an item: references to cells of one writer's history, optionally squeezed
# (exactly one cell, no leading dimension): `TrajectoryColumn(data_references, *,
# squeeze=False, path=None)`, made by indexing `writer.history`. `len`, iteration (cell
# references: `CellRef`, with `expired`, `shape`, `dtype`, `numpy()`), indexing (an int
# squeezes), `is_squeezed`, `shape`, `dtype`, `numpy()`. Native, as is each column of
# `history`: actors slice both on every step, and they read the native writer's cells.
TrajectoryColumn = _native.TrajectoryColumn
CellRef = _native.CellRef
_ColumnHistory = _native.ColumnHistory


def _leaf_at(data: Any, path: Tuple[Any, ...]) -> Any:
    """The leaf of `data` at `path`, for error messages."""
    try:
        for key in path:
            data = (
                getattr(data, key)
                if isinstance(key, str) and hasattr(data, "_fields")
                else data[key]
            )
        return data
    except (KeyError, IndexError, TypeError, AttributeError):
        return "<unknown>"


def _merge(old: Any, new: Any) -> Any:
    """The union of two structures whose leaves are column indices."""
    if old is None:
        return new
    if isinstance(old, collections.abc.Mapping) and isinstance(new, collections.abc.Mapping):
        merged = dict(old)
        for k, v in new.items():
            merged[k] = _merge(old.get(k), v)
        return merged
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)):
        items = [_merge(o, n) for o, n in zip(old, new)]
        items += list(old[len(new) :]) + list(new[len(old) :])
        return type(old)(items) if not hasattr(type(old), "_fields") else type(old)(*items)
    return old


class TrajectoryWriter:
    """Writes steps and creates items from their history. Build it with
    `Client.trajectory_writer(num_keep_alive_refs)`.

    Calls from several threads are serialized (safe, but the history then interleaves).
    """

    def __init__(self, internal_writer: _native.TrajectoryWriter) -> None:
        self._writer = internal_writer
        # The writer column of each leaf path; flattens every step (natively).
        self._columns = _native.StepColumns()
        self._structure: Any = None
        self._history: Any = None
        self._closed = False

    # Columns and structure.

    @property
    def _paths(self) -> List[Path]:
        """Each column's path, by column."""
        return self._columns.paths

    def _path_name(self, column: int) -> str:
        paths = self._columns.paths
        return str(paths[column]) if column < len(paths) else f"#{column}"

    def _grow(self, data: Any, columns: List[int]) -> None:
        """Takes the structure of `data` (whose leaves have `columns`) into `history`: a
        column had its first value in it."""
        self._structure = _merge(self._structure, _nest.pack_sequence_as(data, columns))
        self._history = None

    def _flatten(self, data: Any, width: Optional[int] = None) -> Tuple[List[int], List[Any]]:
        """The column and value of each leaf of `data` (`None` leaves left out); with `width`
        (the legacy writer's), ValueError when `data` has another number of leaves."""
        columns, values, grown = self._columns.flatten(data, width)
        if grown is not None:
            self._grow(data, grown)
        return columns, values

    def _raise_append_error(self, error: _native.AppendError, data: Any) -> None:
        path = self._paths[error.column]
        if error.already_set:
            raise ValueError(
                f"Field {path} has already been set in the active step by previous (partial) "
                f"append call and thus must be omitted or set to None but got: "
                f"{_leaf_at(data, path)}"
            )
        (want_dtype, want_shape), (got_dtype, got_shape) = error.expected, error.got
        if want_dtype != got_dtype:
            raise ValueError(
                f"Tensor of wrong dtype provided for column {path}. Got "
                f"{_native.tf_dtype_name(got_dtype)} but expected "
                f"{_native.tf_dtype_name(want_dtype)}."
            )
        raise ValueError(
            f"Tensor of incompatible shape provided for column {path}. Got "
            f"{_dtypes.shape_string(got_shape)} which is incompatible with "
            f"{_dtypes.shape_string(want_shape)}."
        )

    # Writing.

    def append(self, data: Any, *, partial_step: bool = False) -> None:
        """Appends a step (any nest of array-likes). With `partial_step`, the step stays open
        and later calls may add the fields it did not set. The structure may grow over time."""
        self._check_open()
        error, grown = self._writer.append_step(data, self._columns, partial_step)
        if grown is not None:
            self._grow(data, grown)
        if error is not None:
            self._raise_append_error(error, data)

    def append_steps(self, data: Any) -> None:
        """Appends N full steps at once: every leaf has a leading dimension N (beyond the
        reference; for vectorised or batched producers)."""
        self._check_open()
        self._append_flat_steps(data, *self._flatten(data))

    def _append_flat_steps(self, data: Any, columns: List[int], values: List[Any]) -> None:
        """`append_steps` of `data` flattened already (`_flatten`) to `columns` and `values`."""
        error = self._writer.append_steps(columns, values)
        if error is not None:
            self._raise_append_error(error, data)

    def create_item(self, table: str, priority: float, trajectory: Any) -> None:
        """Creates an item in `table` from a nest of `TrajectoryColumn`s (taken from
        `history`). It is sent in the background; `flush` waits for it."""
        self._check_open()
        if self._writer.create_item_of_columns(table, float(priority), trajectory, self) is None:
            # Not a nest of this writer's columns: the general path says what is wrong.
            self._create_item_of(table, priority, _nest.flatten(trajectory), trajectory)

    def _create_item_of(
        self, table: str, priority: float, leaves: List[Any], trajectory: Any
    ) -> None:
        """`create_item` of a trajectory flattened to `leaves` (errors print `trajectory`)."""
        if not leaves:
            raise ValueError("The trajectory must contain at least one column")
        columns = []
        for leaf in leaves:
            if type(leaf) is not TrajectoryColumn:
                if not isinstance(leaf, TrajectoryColumn):
                    raise TypeError(
                        f"All leaves of `trajectory` must be `TrajectoryColumn` but got "
                        f"{trajectory}"
                    )
            if leaf._writer is not self:
                raise ValueError("Trajectory columns must come from this writer's history")
            columns.append((leaf._cells, leaf.is_squeezed))
        # With validate_items, the native writer checks the item against the table signature.
        self._writer.create_item(table, float(priority), columns)

    def flush(self, block_until_num_items: int = 0, timeout_ms: Optional[int] = None) -> None:
        """Sends every created item and blocks until at most `block_until_num_items` are
        unconfirmed by the server. DeadlineExceededError after `timeout_ms`."""
        if block_until_num_items < 0:
            raise ValueError(f"block_until_num_items must be >= 0, got {block_until_num_items}")
        self._check_open()
        self._writer.flush(block_until_num_items, timeout_ms)

    def end_episode(self, clear_buffers: bool = True, timeout_ms: Optional[int] = None) -> None:
        """Ends the episode and starts a new one (with `clear_buffers` the history is
        dropped), then sends everything and waits for confirmation. On a timeout
        (DeadlineExceededError) the new episode has begun all the same."""
        self._check_open()
        self._writer.end_episode(clear_buffers, timeout_ms)

    def close(self) -> None:
        """Stops the writer. Items that were not flushed may be lost."""
        if not self._closed:
            self._closed = True
            self._writer.close()

    def configure(
        self, path: Path, *, num_keep_alive_refs: int, max_chunk_length: Optional[int]
    ) -> None:
        """Overrides chunking for the column at `path` (`None` chunk length: automatic)."""
        try:
            positive = not isinstance(num_keep_alive_refs, bool) and (
                operator.index(num_keep_alive_refs) >= 1
            )
        except TypeError:
            positive = False
        if not positive:
            raise ValueError(
                f"num_keep_alive_refs ({num_keep_alive_refs}) must be a positive integer"
            )
        if max_chunk_length is not None and not 1 <= max_chunk_length <= num_keep_alive_refs:
            raise ValueError(
                f"max_chunk_length ({max_chunk_length}) must be None or a positive integer <= "
                f"num_keep_alive_refs ({num_keep_alive_refs})"
            )
        self._check_open()
        # (For a vectorised writer, the column is a field and applies in every env.)
        column = self._columns.column(tuple(path))
        self._writer.configure(column, num_keep_alive_refs, max_chunk_length)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("TrajectoryWriter::Close has been called.")

    # History.

    @property
    def history(self) -> Any:
        """A nest like the appended data whose leaves index the column's cells by episode
        step: an int gives a squeezed `TrajectoryColumn`, a slice or list a batched one."""
        if self._structure is None:
            raise RuntimeError("history is not available before the first append")
        if self._history is None:
            paths = self._columns.paths
            self._history = _nest.map_structure(
                lambda column: _ColumnHistory(self, self._writer, column, paths[column]),
                self._structure,
            )
        return self._history

    @property
    def episode_steps(self) -> int:
        """Full steps appended since the episode began."""
        return self._writer.episode_steps

    @property
    def num_unconfirmed_items(self) -> int:
        """Items created but not yet confirmed by the server."""
        return self._writer.unconfirmed()

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # As in the reference: flush unless a ReverbError is propagating. While another
        # exception propagates the flush is bounded (it must not turn an error into a hang),
        # and Ctrl-C / SystemExit skip it.
        if not self._closed:
            flush_on_exit(self.flush, exc_type)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass
