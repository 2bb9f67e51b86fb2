"""`BatchWriter` (beyond the reference): batches of steps inserted as items, several in
flight, for actors that write transitions in batches (`Client.batch_writer`).

`Client.insert_steps` returns once the server stored its batch: an actor in another process
waits a round trip per batch. A `BatchWriter`'s `insert_steps` returns once its batch is
sent and at most `max_in_flight_items` items are unconfirmed, so the actor makes its next
batch while the server stores this one. `flush` waits until the server stored everything.

A batch is checked as `Client.insert_steps` checks it (unknown tables, signatures, shapes:
ValueError, nothing sent). Once taken, it stays in flight until the server confirms it,
whatever happens, but for a refusal:
- A batch the server refuses fails the call that learns of it (one that waits for
  confirmations: a `flush`, or an `insert_steps` waiting for room); the batches sent after it
  go again. A `flush` first waits for the rest to be stored.
- A stream that closes (a restarted server, a broken connection) and a call cut short
  (Ctrl-C, a timeout while waiting) leave the batches in flight, and the next call sends them
  again on a new stream: delivery is at least once. A key the server holds is a priority
  update, but an item a sampler took from a queue before its batch went again is inserted
  again.
- Leaving a `with` block flushes, but not while a `ReverbError` propagates (as the trajectory
  writer): then what is in flight may be lost.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Union

from reverb.trajectory_writer import flush_on_exit

if TYPE_CHECKING:
    from reverb import _native
    from reverb.client import Client


class BatchWriter:
    """Inserts batches of steps as items (N steps: N items per table, item `i` holding step
    `i`, as `Client.insert_steps` stores them), several batches in flight. Use as a context
    manager (leaving it flushes) or call `flush` and `close`."""

    def __init__(self, client: Client, native: _native.BatchWriter) -> None:
        self._client = client
        self._writer = native
        self._closed = False

    def insert_steps(
        self,
        data: Any,
        priorities: Dict[str, Union[float, Sequence[float]]],
        *,
        timeout: Optional[float] = None,
    ) -> None:
        """Sends N steps (every leaf of `data` has a leading dimension N) as N items in each
        table of `priorities` (one priority for all, or N). Returns once the batch is sent and
        at most the writer's `max_in_flight_items` items are unconfirmed (a batch larger than
        that waits until none are). DeadlineExceededError after `timeout` seconds: while
        waiting for room the batch was not taken; while a server of this process stored it
        (its rate limiter blocking), the items stored before the timeout stay and the others
        are not stored, as with `Client.insert_steps`. A refusal of an earlier batch learned
        while waiting for room is raised, and this batch is not taken. With a server of this
        process, the batch is stored before the call returns."""
        self._check_open()
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> Optional[float]:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        def left_ms() -> Optional[int]:
            seconds = left()
            return None if seconds is None else int(seconds * 1000)

        client = self._client
        steps = client._steps(data, priorities)
        if steps is None:
            return
        arrays, pairs = steps
        native = client._native_steps(arrays, pairs, left())
        if native is not None and self._writer.insert_steps(arrays, native, left_ms()):
            return
        # Strings, or a server that takes items one by one (the reference's): the batches in
        # flight first, then this one stored before the call returns.
        self._writer.flush(0, left_ms())
        client.insert_steps(data, priorities, timeout=left())

    def flush(self, block_until_num_items: int = 0, timeout_ms: Optional[int] = None) -> None:
        """Blocks until at most `block_until_num_items` items sent are unconfirmed.
        DeadlineExceededError after `timeout_ms` (the items stay in flight). The refusal of a
        batch learned meanwhile is raised once the rest is confirmed."""
        if block_until_num_items < 0:
            raise ValueError(f"block_until_num_items must be >= 0, got {block_until_num_items}")
        self._check_open()
        self._writer.flush(block_until_num_items, timeout_ms)

    @property
    def num_unconfirmed_items(self) -> int:
        """Items sent and not confirmed by the server yet (with a server of this process,
        batches already stored count until the writer next waits for confirmations)."""
        return 0 if self._closed else self._writer.num_unconfirmed()

    def close(self) -> None:
        """Stops the writer. Items that were not flushed may be lost."""
        if not self._closed:
            self._closed = True
            self._writer.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("The BatchWriter is closed")

    def __enter__(self) -> BatchWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # As the trajectory writer: flush unless a ReverbError is propagating (bounded while
        # another exception propagates; Ctrl-C and SystemExit skip it), then close.
        try:
            if not self._closed:
                flush_on_exit(self.flush, exc_type)
        finally:
            self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass
