"""`Client`: insert, sample, mutate priorities, reset and inspect a Reverb server."""

from __future__ import annotations

import functools
import numbers
import os
import time
from typing import Any, Dict, Generator, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from reverb import (
    _dtypes,
    _native,
    _nest,
    _signature,
    batch_writer,
    errors,
    legacy_writer,
    replay_sample,
    reverb_types,
    structured_writer,
    trajectory_writer,
    vector_trajectory_writer,
)

Writer = legacy_writer.Writer

# A file's path (the TLS settings).
PathLike = Union[str, "os.PathLike[str]"]


def _step_of(i: int, value: Any) -> Any:
    """Step `i` of a value with a leading step dimension."""
    return np.asarray(value)[i]


class Client:
    """A client of the Reverb server at `server_address` (`host:port`).

    Creating a client does not connect; calls connect (and reconnect) as needed. Blocking calls
    take an optional `timeout` in seconds and can be interrupted with Ctrl-C. Not in the
    reference: `auth_token` is sent with every call, for servers that require one (by default
    the `REVERB_AUTH_TOKEN` environment variable, when set); with `tls_ca` (a PEM file of the
    authority that signed the server's certificate) calls go over TLS, presenting the
    certificate `tls_cert` with its key `tls_key` to servers that require one (by default
    the `REVERB_TLS_CA`, `REVERB_TLS_CLIENT_CERT` and `REVERB_TLS_CLIENT_KEY` variables).
    """

    def __init__(
        self,
        server_address: str,
        auth_token: Optional[str] = None,
        *,
        tls_ca: Optional[PathLike] = None,
        tls_cert: Optional[PathLike] = None,
        tls_key: Optional[PathLike] = None,
    ) -> None:
        if not isinstance(server_address, str) or not server_address:
            raise ValueError(f"server_address must be a non-empty string, got {server_address!r}")
        if auth_token is not None and not isinstance(auth_token, str):
            raise TypeError(f"auth_token must be a string, got {type(auth_token).__name__}")
        self._server_address = server_address
        self._auth_token = auth_token or None
        self._tls = {
            k: None if v is None else os.fspath(v)
            for k, v in dict(tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key).items()
        }
        self._client = self._connect()
        # What the server said of each table (native `TableInfo`s, decoded once), by name,
        # from the last `server_info`; signatures as nests of `tf.TensorSpec` (needs
        # TensorFlow) decoded from them lazily.
        self._tables: Dict[str, _native.TableInfo] = {}
        self._signature_cache: Dict[str, Any] = {}

    def _connect(self) -> _native.Client:
        """A native client of the server with this client's token and TLS settings (a
        connection of its own)."""
        return _native.Client(self._server_address, self._auth_token, **self._tls)

    def __reduce__(self) -> Any:
        tls = {k: v for k, v in self._tls.items() if v is not None}
        if tls:
            return functools.partial(type(self), **tls), (
                self._server_address,
                self._auth_token,
            )
        if self._auth_token is None:
            return type(self), (self._server_address,)
        return type(self), (self._server_address, self._auth_token)

    def __repr__(self) -> str:
        return f"Client(server_address={self._server_address!r})"

    @property
    def server_address(self) -> str:
        """The address this client talks to."""
        return self._server_address

    def insert(
        self,
        data: Any,
        priorities: Dict[str, float],
        *,
        timeout: Optional[float] = None,
    ) -> None:
        """Inserts one step (`data`, any nest of array-likes) as one item in each table named in
        `priorities`. The items share the step's chunks. Returns once the server stored them."""
        if not priorities:
            raise ValueError("priorities must contain at least one item")
        # Like the reference, check the tables first: a bad name stores nothing anywhere.
        self._check_tables(priorities, timeout)
        leaves = _nest.flatten(data)
        if not leaves:
            raise ValueError("data must contain at least one value")
        arrays = [_dtypes.as_array(leaf) for leaf in leaves]
        # (ValueError for unsupported dtypes.)
        step = [(_dtypes.tf_enum(a.dtype), a.shape, (1, *a.shape)) for a in arrays]
        for table in priorities:
            self._check_signature(str(table), step)
        pairs = [(str(table), float(priority)) for table, priority in priorities.items()]
        timeout_ms = None if timeout is None else max(0, int(timeout * 1000))
        # Natively, as TFClient.insert: each insert a one-step episode of a writer kept
        # between inserts (one insert stream), as with the reference's legacy writer.
        self._client.insert(arrays, pairs, timeout_ms)

    def insert_steps(
        self,
        data: Any,
        priorities: Dict[str, Union[float, Sequence[float]]],
        *,
        timeout: Optional[float] = None,
    ) -> None:
        """Inserts N steps at once as N items in each table named in `priorities` (beyond the
        reference; for transition buffers): every leaf of `data` has a leading dimension N,
        and item `i` holds step `i`, as `insert` of that step would. A table's priority is
        one number for all N items or N numbers. One native call; returns once the server
        stored every item. On an error or a timeout, the items stored before it stay and the
        others are never stored later."""
        steps = self._steps(data, priorities)
        if steps is None:
            return
        arrays, pairs = steps
        native = self._native_steps(arrays, pairs, timeout)
        if native is None:
            # (Strings go one step at a time, within the call's one timeout.)
            deadline = None if timeout is None else time.monotonic() + timeout
            for i in range(len(arrays[0])):
                step = _nest.map_structure(functools.partial(_step_of, i), data)
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                self.insert(step, {t: p[i] for t, p in pairs}, timeout=left)
            return
        timeout_ms = None if timeout is None else max(0, int(timeout * 1000))
        self._client.insert_steps(arrays, native, timeout_ms)

    def _steps(
        self, data: Any, priorities: Dict[str, Union[float, Sequence[float]]]
    ) -> Optional[Tuple[List[np.ndarray], List[Tuple[str, np.ndarray]]]]:
        """`insert_steps`' arguments as arrays (one per leaf, N steps each) and per table N
        float64 priorities; None when N is 0. ValueError when they do not fit together."""
        if not priorities:
            raise ValueError("priorities must contain at least one item")
        leaves = _nest.flatten(data)
        if not leaves:
            raise ValueError("data must contain at least one value")
        arrays = [_dtypes.as_array(leaf) for leaf in leaves]
        if any(a.ndim == 0 for a in arrays) or len({a.shape[0] for a in arrays}) != 1:
            shapes = [list(a.shape) for a in arrays]
            raise ValueError(
                "insert_steps needs every value to have the same leading (step) dimension; "
                f"got shapes {shapes}"
            )
        n = arrays[0].shape[0]
        if n == 0:
            return None
        pairs = []
        for table, priority in priorities.items():
            values = np.asarray(priority, np.float64)
            if values.ndim == 0:
                values = np.full(n, float(values))
            if values.shape != (n,):
                raise ValueError(
                    f"table '{table}' needs one priority or {n} (one per step); got "
                    f"{np.shape(priority)}"
                )
            pairs.append((str(table), values))
        return arrays, pairs

    def _native_steps(
        self,
        arrays: List[np.ndarray],
        pairs: List[Tuple[str, np.ndarray]],
        timeout: Optional[float],
    ) -> Optional[List[Tuple[str, bytes]]]:
        """The priorities of steps `_steps` made, as the native batched insert takes them (per
        table, float64 bytes: no Python float per step), once the tables and signatures are
        checked; None when a leaf holds strings (the native batch does not take them).
        ValueError (nothing is inserted) for an unknown table, or steps that do not fit a
        table's signature."""
        if any(a.dtype.kind in "OSU" for a in arrays):
            return None
        self._check_tables([t for t, _ in pairs], timeout)
        # (ValueError for unsupported dtypes.)
        step = [(_dtypes.tf_enum(a.dtype), a.shape[1:], (1, *a.shape[1:])) for a in arrays]
        for table, _ in pairs:
            self._check_signature(table, step)
        return [(t, np.ascontiguousarray(p, np.float64).tobytes()) for t, p in pairs]

    def _check_tables(self, tables: Iterable[str], timeout: Optional[float]) -> None:
        """ValueError, as the reference's, when the server has no table of one of `tables`
        (the server is asked again before that is said)."""
        missing = [t for t in tables if t not in self._tables]
        if missing:
            self._table_infos(timeout)
            missing = [t for t in tables if t not in self._tables]
            if missing:
                known = sorted(self._tables)
                raise ValueError(
                    f"Unable to find signatures for table '{missing[0]}' in signature cache.  "
                    f"Available tables: {known}. (The server at {self._server_address} has no "
                    "such table.)"
                )

    def _check_signature(self, table: str, step: List[tuple]) -> None:
        """ValueError (nothing is inserted) when one `step` (per leaf: TF dtype, shape, shape
        with a leading time dimension of 1) does not fit the table's signature: as in the
        reference, a leaf fits a spec of either shape."""
        signature = self._table_signature(table, None)
        if signature is None:
            return
        problem = signature.problem(table, step)
        if problem is not None:
            raise ValueError(problem)

    def sample(
        self,
        table: str,
        num_samples: int = 1,
        *,
        emit_timesteps: bool = True,
        unpack_as_table_signature: bool = False,
        timeout: Optional[float] = None,
    ) -> Generator[Union[List[replay_sample.ReplaySample], replay_sample.ReplaySample], None, None]:
        """Samples `num_samples` items from `table`.

        Yields, per item, a list of `ReplaySample` (one per timestep) when `emit_timesteps`, or
        one `ReplaySample` holding whole columns otherwise. `data` is a flat list of arrays, or
        the table signature's nest when `unpack_as_table_signature` and the table has one.
        Blocks while the table's rate limiter does not allow sampling; `timeout` (seconds)
        bounds each wait and raises `DeadlineExceededError`.
        """
        num_samples = check_num_samples(num_samples)
        signature = None
        if unpack_as_table_signature:
            signature = self._signature(table, timeout)
        # Samples are fetched in growing batches, except from tables where sampling deletes
        # items (max_times_sampled, e.g. queues): there one at a time, so stopping the
        # iteration early never consumes items that were not yielded.
        grow = 2 if self._max_times_sampled(table, timeout) == 0 else 1
        remaining = num_samples
        batch = 1
        while remaining > 0:
            count = min(batch, remaining)
            samples, failure = self._client.sample(table, count, None, timeout)
            for info, columns in samples:
                yield to_sample(info, columns, emit_timesteps, signature)
            if failure is not None:
                raise failure
            remaining -= count
            batch = min(batch * grow, 256)

    def mutate_priorities(
        self,
        table: str,
        updates: Optional[Dict[int, float]] = None,
        deletes: Optional[List[int]] = None,
        *,
        timeout: Optional[float] = None,
    ) -> None:
        """Deletes `deletes`, then sets the priorities in `updates`. Unknown keys are ignored."""
        updates = updates or {}
        n = len(updates)
        # (As arrays: no Python tuple per update on either side of the call.)
        keys = np.fromiter(updates.keys(), np.uint64, n).tobytes()
        values = np.fromiter(updates.values(), np.float64, n).tobytes()
        deleted = [int(k) for k in deletes or []]
        self._client.mutate_priorities(table, keys, values, deleted, timeout)

    def reset(self, table: str, *, timeout: Optional[float] = None) -> None:
        """Removes every item of `table` and resets its rate limiter."""
        self._client.reset(table, timeout)

    def server_info(self, timeout: Optional[int] = None) -> Dict[str, reverb_types.TableInfo]:
        """Every table's `TableInfo`, by name. `timeout` in seconds (None or 0: no deadline)."""
        result = {
            name: reverb_types.TableInfo.from_serialized_proto(info.serialized())
            for name, info in self._table_infos(timeout).items()
        }
        self._signature_cache = {name: info.signature for name, info in result.items()}
        return result

    def _table_infos(self, timeout: Optional[float]) -> Dict[str, _native.TableInfo]:
        """Asks the server for its tables (native `TableInfo`s by name) and caches them;
        decodes no signature as `tf.TensorSpec`s (so needs no TensorFlow)."""
        self._tables = {info.name: info for info in self._client.server_info(timeout or None)}
        self._signature_cache = {}
        return self._tables

    def _max_times_sampled(self, table: str, timeout: Optional[float]) -> int:
        """The table's max_times_sampled (cached; 1 if the server cannot tell us).
        DeadlineExceededError when the server did not answer within `timeout`."""
        if table not in self._tables:
            try:
                self._table_infos(timeout)
            except errors.DeadlineExceededError:
                raise
            except errors.ReverbError:
                return 1
        # Unknown tables fail in the sample call itself, with the server's message.
        info = self._tables.get(table)
        return 1 if info is None else info.max_times_sampled

    def checkpoint(self, *, timeout: Optional[float] = None) -> str:
        """Asks the server to write a checkpoint; returns its path."""
        return self._client.checkpoint(timeout)

    def trajectory_writer(
        self,
        num_keep_alive_refs: int,
        *,
        validate_items: bool = True,
        max_in_flight_items: int = 1024,
        delta_encode: bool = False,
        get_signature_timeout_ms: Optional[int] = None,
    ) -> trajectory_writer.TrajectoryWriter:
        """A `TrajectoryWriter` whose columns keep their last `num_keep_alive_refs` cells
        referenceable. At most `max_in_flight_items` items are unconfirmed at once: beyond
        that `create_item` waits (no unbounded memory if you never flush). `delta_encode`
        stores integer columns as differences between steps (smaller for counters/frames).
        `get_signature_timeout_ms` (from Reverb before 0.8, which programs such as dm-acme 0.4
        pass) bounds how long the first item of a table waits for the server's signatures
        (default 60 s)."""
        if num_keep_alive_refs < 1:
            raise ValueError(
                f"num_keep_alive_refs ({num_keep_alive_refs}) must be a positive integer"
            )
        if max_in_flight_items < 1:
            raise ValueError(f"max_in_flight_items ({max_in_flight_items}) must be >= 1")
        if get_signature_timeout_ms is not None and get_signature_timeout_ms < 0:
            raise ValueError(
                f"get_signature_timeout_ms ({get_signature_timeout_ms}) must be None or >= 0"
            )
        native = _native.TrajectoryWriter(
            self._client,
            num_keep_alive_refs=num_keep_alive_refs,
            max_in_flight_items=max_in_flight_items,
            delta_encode=delta_encode,
            validate_items=validate_items,
            signature_timeout_ms=get_signature_timeout_ms,
        )
        return trajectory_writer.TrajectoryWriter(native)

    def writer(
        self,
        max_sequence_length: int,
        delta_encoded: bool = False,
        chunk_length: Optional[int] = None,
        max_in_flight_items: Optional[int] = 25,
    ) -> legacy_writer.Writer:
        """The legacy `Writer` (prefer `trajectory_writer`): items reference the newest
        `num_timesteps <= max_sequence_length` steps. `chunk_length` (default
        `min(10, max_sequence_length)`) steps are compressed together, delta-encoded with
        `delta_encoded`; at most `max_in_flight_items` items (None: no limit) await
        confirmation."""
        if max_sequence_length < 1:
            raise ValueError(
                f"max_sequence_length ({max_sequence_length}) must be a positive integer"
            )
        if chunk_length is None:
            chunk_length = min(10, max_sequence_length)
        if chunk_length < 1 or chunk_length > max_sequence_length:
            raise ValueError(
                f"chunk_length ({chunk_length}) must be a positive integer le to "
                f"max_sequence_length ({max_sequence_length})"
            )
        if max_in_flight_items is None:
            max_in_flight_items = 1_000_000
        if max_in_flight_items < 1:
            raise ValueError(
                f"max_in_flight_items ({max_in_flight_items}) must be a positive integer"
            )
        native = _native.TrajectoryWriter(
            self._client,
            num_keep_alive_refs=max_sequence_length,
            max_chunk_length=chunk_length,
            max_in_flight_items=max_in_flight_items,
            delta_encode=delta_encoded,
        )
        return legacy_writer.Writer(
            # The legacy writer checks signatures itself (they may describe one step).
            trajectory_writer.TrajectoryWriter(native),
            self,
            max_sequence_length=max_sequence_length,
            chunk_length=chunk_length,
            delta_encoded=delta_encoded,
            max_in_flight_items=max_in_flight_items,
        )

    def structured_writer(
        self, configs: List[structured_writer.Config], *, max_in_flight_items: int = 1024
    ) -> structured_writer.StructuredWriter:
        """A `StructuredWriter` inserting items as `configs` (`structured_writer.Config`s,
        e.g. from `structured_writer.create_config`) say. ValueError if there are none or one
        is malformed (the error names it); items that disagree with their table's signature
        are refused at the `append` that would make them."""
        if not configs:
            raise ValueError("At least one config must be provided.")
        if max_in_flight_items < 1:
            raise ValueError(f"max_in_flight_items ({max_in_flight_items}) must be >= 1")
        serialized = []
        for i, config in enumerate(configs):
            if not hasattr(config, "SerializeToString"):
                raise ValueError(
                    f"Invalid configuration at position {i}: expected a StructuredWriterConfig, "
                    f"got {type(config).__name__}"
                )
            serialized.append(config.SerializeToString())
        native = _native.StructuredWriter(
            self._client, serialized, max_in_flight_items=max_in_flight_items
        )
        return structured_writer.StructuredWriter(native)

    def vector_trajectory_writer(
        self,
        num_envs: int,
        num_keep_alive_refs: int,
        *,
        validate_items: bool = True,
        max_in_flight_items: int = 4096,
        delta_encode: bool = False,
    ) -> vector_trajectory_writer.VectorTrajectoryWriter:
        """A writer of `num_envs` parallel episodes (a vectorised environment; beyond the
        reference): each `append` adds one step to every environment, `create_item` makes
        one item per environment, `end_episode(envs=...)` ends some episodes. Options as in
        `trajectory_writer`, per (field, environment) column."""
        if num_envs < 1:
            raise ValueError(f"num_envs ({num_envs}) must be >= 1")
        if num_keep_alive_refs < 1:
            raise ValueError(
                f"num_keep_alive_refs ({num_keep_alive_refs}) must be a positive integer"
            )
        if max_in_flight_items < 1:
            raise ValueError(f"max_in_flight_items ({max_in_flight_items}) must be >= 1")
        native = _native.TrajectoryWriter(
            self._client,
            num_keep_alive_refs=num_keep_alive_refs,
            max_in_flight_items=max_in_flight_items,
            delta_encode=delta_encode,
            num_envs=num_envs,
            validate_items=validate_items,
        )
        return vector_trajectory_writer.VectorTrajectoryWriter(native, num_envs)

    def batch_writer(self, *, max_in_flight_items: int = 4096) -> batch_writer.BatchWriter:
        """A `BatchWriter` (beyond the reference): `insert_steps` as `Client.insert_steps`
        stores them, but several batches in flight on a stream of its own. A call returns once
        its batch is sent and at most `max_in_flight_items` items are unconfirmed (a larger
        batch waits until none are), so an actor makes its next batch while the server stores
        this one; `flush` waits for the rest."""
        if max_in_flight_items < 1:
            raise ValueError(f"max_in_flight_items ({max_in_flight_items}) must be >= 1")
        native = _native.BatchWriter(self._client, max_in_flight_items)
        return batch_writer.BatchWriter(self, native)

    def _table(self, table: str, timeout: Optional[float]) -> _native.TableInfo:
        """The `TableInfo` of `table` (asks the server if it is not known yet);
        NotFoundError if the server has no such table."""
        if table not in self._tables:
            self._table_infos(timeout)
        if table not in self._tables:
            raise errors.NotFoundError(
                f"Table {table} was not found on {self._server_address}. "
                f"Available tables: [{', '.join(sorted(self._tables))}]"
            )
        return self._tables[table]

    def _signature(self, table: str, timeout: Optional[float]) -> Any:
        """The signature of `table` as a nest of `tf.TensorSpec` (None without one)."""
        info = self._table(table, timeout)
        if table not in self._signature_cache:
            self._signature_cache[table] = _signature.decode(info.signature_bytes)
        return self._signature_cache[table]

    def _table_signature(
        self, table: str, timeout: Optional[float]
    ) -> Optional[_native.TableSignature]:
        """`table`'s signature, flattened (None without one), decoded natively once: no
        TensorFlow needed."""
        return self._table(table, timeout).signature


def check_num_samples(num_samples: Any) -> int:
    """`num_samples` as an int; TypeError or ValueError (as the reference) when it is not an
    integer >= 1."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, numbers.Integral):
        raise TypeError(f"num_samples must be an integer, got {num_samples!r}")
    if num_samples < 1:
        raise ValueError(f"num_samples ({num_samples}) must be >= 1")
    return int(num_samples)


def to_sample(
    sample_info: replay_sample.SampleInfo, columns: list, emit_timesteps: bool, signature: Any
) -> Union[List[replay_sample.ReplaySample], replay_sample.ReplaySample]:
    arrays = [_dtypes.from_column(c) for c in columns]

    def pack(flat: List[np.ndarray]) -> Any:
        return flat if signature is None else _nest.pack_sequence_as(signature, flat)

    if not emit_timesteps:
        return replay_sample.ReplaySample(info=sample_info, data=pack(arrays))
    lengths = {a.shape[0] if a.ndim else None for a in arrays}
    if len(lengths) != 1 or None in lengths:
        raise ValueError(
            "Can't emit timesteps: the sampled columns have different lengths "
            f"({sorted(str(n) for n in lengths)}); use emit_timesteps=False"
        )
    (length,) = lengths
    return [
        replay_sample.ReplaySample(info=sample_info, data=pack([a[t, ...] for a in arrays]))
        for t in range(length)
    ]
