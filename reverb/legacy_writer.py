"""The legacy `Writer` (`Client.writer(max_sequence_length)`, Reverb's first writer API):
dense steps, and items of the last `num_timesteps` steps of every leaf. Built on the
trajectory writer, so it shares its chunking, insert stream and signature checks."""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Set, Tuple

from reverb import _dtypes, _native, _nest, errors, trajectory_writer


class Writer:
    """Appends dense steps and creates items from the newest ones. Build it with
    `Client.writer(max_sequence_length, ...)`; close it (or use it as a context manager)."""

    def __init__(
        self,
        writer: trajectory_writer.TrajectoryWriter,
        client: Any,
        *,
        max_sequence_length: int,
        chunk_length: int,
        delta_encoded: bool,
        max_in_flight_items: int,
    ) -> None:
        self._writer = writer
        self._client = client
        self._max_sequence_length = max_sequence_length
        self._chunk_length = chunk_length
        self._delta_encoded = delta_encoded
        self._max_in_flight_items = max_in_flight_items
        self._width: Optional[int] = None
        self._closed = False
        # The history's columns, flattened once per structure (`history` changes with it).
        self._history: Any = None
        self._columns: Tuple[int, ...] = ()
        # Per table: its flat specs ([] when it has no signature), looked up once.
        self._specs: Dict[str, Optional[_native.TableSignature]] = {}
        # (table, num_timesteps, columns) whose items fit the table's signature: a column's
        # dtype and row shape never change, so each is checked once.
        self._checked: Set[Tuple[str, int, Tuple[int, ...]]] = set()

    def __enter__(self) -> Writer:
        if self._closed:
            raise ValueError("Cannot reuse already closed Writer")
        return self

    def __exit__(self, *_: Any) -> None:
        self.flush()
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            logging.warning("Writer-object deleted without calling .close explicitly.")
            self.close()

    def __repr__(self) -> str:
        return (
            f"Writer(chunk_length={self._chunk_length}, "
            f"max_timesteps={self._max_sequence_length}, "
            f"delta_encoded={int(self._delta_encoded)}, "
            f"max_in_flight_items={self._max_in_flight_items}, "
            f"index_within_episode={self._writer.episode_steps}, closed={int(self._closed)}), "
            f"closed: {self._closed}"
        )

    def append(self, data: Any) -> None:
        """Appends one step (a nest of array-likes, the same structure every time). Nothing
        is sent until an item references it."""
        writer = self._writer
        writer._check_open()
        # (One native call: the step is flattened, its width checked, then appended.)
        error, grown = writer._writer.append_step(data, writer._columns, False, self._width)
        self._width = writer._columns.width
        if grown is not None:
            writer._grow(data, grown)
        if error is not None:
            writer._raise_append_error(error, data)

    def append_sequence(self, sequence: Any) -> None:
        """Appends `T` steps at once: every leaf has the leading dimension `T`."""
        writer = self._writer
        writer._check_open()
        # (Flattened with the width check of `append`, before the history takes the steps.)
        columns, values = writer._flatten(sequence, self._width)
        self._width = writer._columns.width
        writer._append_flat_steps(sequence, columns, values)

    def create_item(self, table: str, num_timesteps: int, priority: float) -> None:
        """Creates an item in `table` of the newest `num_timesteps` steps (every leaf, with
        a leading time dimension). ValueError if `num_timesteps` < 1 or more than the steps
        buffered, or if the item disagrees with the table's signature."""
        if num_timesteps < 1:
            raise ValueError(f"num_timesteps ({num_timesteps}) must be a positive integer")
        buffered = min(self._writer.episode_steps, self._max_sequence_length)
        if num_timesteps > buffered:
            raise ValueError(
                "Argument `num_timesteps` is larger than number of buffered timesteps."
            )
        history = self._writer.history
        if history is not self._history:
            leaves = _nest.flatten(history)
            self._history, self._columns = history, tuple(h._column for h in leaves)
        key = (table, num_timesteps, self._columns)
        if key not in self._checked:
            signature = self._table_signature(table)
            if signature is not None:
                leaves = [h[-num_timesteps:] for h in _nest.flatten(history)]
                self._check_signature(table, signature, leaves)
            self._checked.add(key)
        self._writer._check_open()
        self._writer._writer.create_item_of_last(
            table, float(priority), self._columns, num_timesteps
        )

    def _check_signature(
        self, table: str, signature: _native.TableSignature, columns: list
    ) -> None:
        """ValueError unless every column fits the table's signature, as the reference
        checks: a spec of one step's shape, or of the item's `[T, ...]` shape."""
        leaves = [(_dtypes.tf_enum(c.dtype), tuple(c.shape)[1:], tuple(c.shape)) for c in columns]
        problem = signature.problem(table, leaves)
        if problem is not None:
            raise ValueError(problem)

    def _table_signature(self, table: str) -> Optional[_native.TableSignature]:
        """`table`'s signature (None without one), looked up once; ValueError if the table
        is unknown."""
        if table in self._specs:
            return self._specs[table]
        client = self._client
        try:
            signature = self._specs[table] = client._table_signature(table, None)
        except errors.NotFoundError:
            # The reference's legacy writer refuses unknown tables with a ValueError.
            raise ValueError(
                f"Unable to find signatures for table '{table}' in signature cache.  "
                f"Available tables: {sorted(client._tables)}. (The server at "
                f"{client.server_address} has no such table.)"
            ) from None
        return signature

    def flush(self) -> None:
        """Sends every created item and waits until the server confirmed them."""
        self._writer.flush()

    def close(self, retry_on_unavailable: bool = True) -> None:
        """Sends every created item, waits for the server's confirmation and stops the writer.
        ValueError if it was closed already. (`retry_on_unavailable` is accepted: the writer
        always reconnects, within its reconnect timeout.)"""
        del retry_on_unavailable
        if self._closed:
            raise ValueError("close() has already been called on Writer.")
        self._closed = True
        try:
            self._writer.flush()
        finally:
            self._writer.close()
