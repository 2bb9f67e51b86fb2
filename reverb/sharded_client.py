"""`ShardedClient`: one client over several Reverb servers (shards), used as one server.

Not in the reference. Writes spread over the shards (inserts round robin or by key; a
writer's episode stays on one shard, and its next episode goes to the next shard); samples are
drawn from the union of the shards' items with the distribution one table holding all of them
would have: a shard is drawn in proportion to its table's size (uniform) or priority mass
(prioritized: the sum of priority^exponent), and `SampleInfo.probability` and `table_size`
are the global ones. Priority updates go only to the shard that holds each key (item keys
written through a `ShardedClient` name their shard). A shard that cannot be reached is
skipped by samplers until it answers again.

    client = reverb.ShardedClient(['replay-0:8000', 'replay-1:8000'])
    with client.trajectory_writer(num_keep_alive_refs=2) as writer: ...
    for sample in client.sample('replay', num_samples=32): ...
    reverb.TrajectoryIterator(client.server_addresses, 'replay', batch_size=256)
"""

from __future__ import annotations

import functools
import itertools
import numbers
import random
import threading
import time
import zlib
from typing import Any, Callable, Dict, Generator, List, Optional, Sequence, Union

from reverb import _native, _proto, errors, legacy_writer, replay_sample, reverb_types
from reverb import batch_writer as batch_writer_lib
from reverb import client as client_lib
from reverb import structured_writer as structured_writer_lib
from reverb import trajectory_writer as trajectory_writer_lib
from reverb import vector_trajectory_writer as vector_writer_lib

# The most shards one client spreads writes over (item keys carry the shard in 6 bits; the
# key marks and shard weights are `reverb-client`'s `shards` module's).
MAX_SHARDS = _native.MAX_SHARDS

Placement = Callable[[Any, Dict[str, float]], int]


def key_shard(key: int) -> Optional[int]:
    """The index of the shard that holds the item with this key, when a `ShardedClient`
    wrote it; None for keys of unknown origin."""
    return _native.key_shard(int(key) & (2**64 - 1))  # (also the int64 view of a uint64 key)


class _ShardClient(client_lib.Client):
    """A `Client` of shard `shard`: the keys of items written through it name the shard."""

    def __init__(
        self, server_address: str, auth_token: Optional[str], shard: int, **tls: Any
    ) -> None:
        self._shard = shard
        super().__init__(server_address, auth_token, **tls)

    def _connect(self) -> _native.Client:
        return _native.Client(
            self._server_address, self._auth_token, key_shard=self._shard, **self._tls
        )

    def __reduce__(self) -> Any:
        tls = {k: v for k, v in self._tls.items() if v is not None}
        return functools.partial(_ShardClient, **tls), (
            self._server_address,
            self._auth_token,
            self._shard,
        )


class ShardedClient:
    """A client of the Reverb servers at `server_addresses` (each `host:port`), used as one.

    `placement(data, priorities) -> shard index` chooses the shard of each `insert` (default:
    round robin, starting from a random shard so that many actors spread; a `placement`
    function must be picklable for the client to be). With `route_priority_updates` (the
    default), priority updates of keys that name a shard go only there; turn it off when
    writers other than ours (e.g. dm-reverb's clients, whose random keys name a shard one
    time in 64) write to the shards, to send every update to every shard. Other arguments as
    `reverb.Client`'s, applied to every shard. Creating it does not connect.
    """

    def __init__(
        self,
        server_addresses: Sequence[str],
        auth_token: Optional[str] = None,
        *,
        placement: Optional[Placement] = None,
        route_priority_updates: bool = True,
        tls_ca: Optional[client_lib.PathLike] = None,
        tls_cert: Optional[client_lib.PathLike] = None,
        tls_key: Optional[client_lib.PathLike] = None,
    ) -> None:
        if isinstance(server_addresses, str):
            raise TypeError(
                "server_addresses must be a sequence of addresses, got a string; "
                "use reverb.Client for one server"
            )
        addresses = list(server_addresses)
        if not addresses:
            raise ValueError("server_addresses must name at least one server")
        if len(addresses) > MAX_SHARDS:
            raise ValueError(
                f"A ShardedClient has at most {MAX_SHARDS} shards, got {len(addresses)}"
            )
        for address in addresses:
            if not isinstance(address, str) or not address or "," in address:
                raise ValueError(f"Invalid server address {address!r} in server_addresses")
        if len(set(addresses)) != len(addresses):
            raise ValueError(f"server_addresses has duplicates: {addresses}")
        if placement is not None and not callable(placement):
            raise TypeError("placement must be a function (data, priorities) -> shard index")
        self._auth_token = auth_token
        self._tls = dict(tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key)
        self._placement = placement
        self._route = bool(route_priority_updates)
        self._shards = [
            _ShardClient(address, auth_token, i, **self._tls) for i, address in enumerate(addresses)
        ]
        self._next_shard = itertools.count(random.randrange(len(addresses)))
        self._lock = threading.Lock()
        # Shards that did not answer a sampler's question (asked briefly until they do).
        self._missing: set = set()

    def __reduce__(self) -> Any:
        return _rebuild, (
            self.server_addresses,
            self._auth_token,
            self._placement,
            self._tls,
            self._route,
        )

    def __repr__(self) -> str:
        return f"ShardedClient(server_addresses={self.server_addresses!r})"

    @property
    def server_addresses(self) -> List[str]:
        """The shards' addresses, in shard order."""
        return [c.server_address for c in self._shards]

    @property
    def shards(self) -> List[client_lib.Client]:
        """A `Client` of each shard, in shard order."""
        return list(self._shards)

    def _round_robin(self) -> int:
        with self._lock:
            return next(self._next_shard) % len(self._shards)

    def _shard_of(self, shard_key: Any) -> int:
        if isinstance(shard_key, numbers.Integral) and not isinstance(shard_key, bool):
            return int(shard_key) % len(self._shards)
        if isinstance(shard_key, str):
            shard_key = shard_key.encode()
        if not isinstance(shard_key, bytes):
            raise TypeError(
                f"shard_key must be an int, str or bytes, got {type(shard_key).__name__}"
            )
        return zlib.crc32(shard_key) % len(self._shards)

    # Writing.

    def insert(
        self,
        data: Any,
        priorities: Dict[str, float],
        *,
        timeout: Optional[float] = None,
        shard_key: Any = None,
    ) -> None:
        """`Client.insert` into one shard: the one `shard_key` (an int, str or bytes) maps to,
        else the one `placement` chooses, else the next in round robin."""
        index = self._placed(data, priorities, shard_key)
        self._shards[index].insert(data, priorities, timeout=timeout)

    def insert_steps(
        self,
        data: Any,
        priorities: Dict[str, Any],
        *,
        timeout: Optional[float] = None,
        shard_key: Any = None,
    ) -> None:
        """`Client.insert_steps` (N steps as N items per table) into one shard, chosen as
        `insert` chooses (`placement` is called with the whole batch)."""
        index = self._placed(data, priorities, shard_key)
        self._shards[index].insert_steps(data, priorities, timeout=timeout)

    def _placed(self, data: Any, priorities: Dict[str, Any], shard_key: Any) -> int:
        """The shard an insert goes to (see `insert`)."""
        if shard_key is not None:
            return self._shard_of(shard_key)
        if self._placement is not None:
            index = int(self._placement(data, priorities))
            if not 0 <= index < len(self._shards):
                raise ValueError(
                    f"placement chose shard {index}; there are {len(self._shards)} shards"
                )
            return index
        return self._round_robin()

    def batch_writer(self, **kwargs: Any) -> batch_writer_lib.BatchWriter:
        """`Client.batch_writer` on one shard (the next in round robin): writers spread over
        the shards."""
        return self._shards[self._round_robin()].batch_writer(**kwargs)

    def trajectory_writer(self, num_keep_alive_refs: int, **kwargs: Any) -> ShardedTrajectoryWriter:
        """A trajectory writer (arguments as `Client.trajectory_writer`'s) whose episodes go to
        the shards in turn: each episode stays on one shard, and `end_episode` moves the next
        one to the next shard."""
        # Checks the arguments now, as the reference does.
        first = self._round_robin()
        writer = self._shards[first].trajectory_writer(num_keep_alive_refs, **kwargs)
        return ShardedTrajectoryWriter(
            self,
            lambda shard: self._shards[shard].trajectory_writer(num_keep_alive_refs, **kwargs),
            first,
            writer,
        )

    def vector_trajectory_writer(
        self, num_envs: int, num_keep_alive_refs: int, **kwargs: Any
    ) -> vector_writer_lib.VectorTrajectoryWriter:
        """`Client.vector_trajectory_writer` on one shard (the next in round robin): all of
        this writer's episodes stay there; writers spread over the shards."""
        shard = self._shards[self._round_robin()]
        return shard.vector_trajectory_writer(num_envs, num_keep_alive_refs, **kwargs)

    def writer(self, max_sequence_length: int, **kwargs: Any) -> legacy_writer.Writer:
        """The legacy `Client.writer` on one shard (the next in round robin)."""
        return self._shards[self._round_robin()].writer(max_sequence_length, **kwargs)

    def structured_writer(
        self, configs: List[structured_writer_lib.Config], **kwargs: Any
    ) -> structured_writer_lib.StructuredWriter:
        """`Client.structured_writer` on one shard (the next in round robin)."""
        return self._shards[self._round_robin()].structured_writer(configs, **kwargs)

    # Sampling.

    def sample(
        self,
        table: str,
        num_samples: int = 1,
        *,
        emit_timesteps: bool = True,
        unpack_as_table_signature: bool = False,
        timeout: Optional[float] = None,
    ) -> Generator[Union[List[replay_sample.ReplaySample], replay_sample.ReplaySample], None, None]:
        """`Client.sample` over the union of the shards' items: each sample comes from a shard
        drawn in proportion to its table's weight (size, or priority mass for prioritized
        tables); its `probability` and `table_size` are the global ones. Shards that cannot
        be reached are skipped, and one that goes away mid-call has its samples drawn from
        the others. With `timeout` (seconds), waiting for a non-empty table, and each wait
        of a shard (bounded by what is left of `timeout` when its stream opens), raise
        `DeadlineExceededError` when it passes."""
        num_samples = client_lib.check_num_samples(num_samples)
        deadline = None if not timeout else time.monotonic() + timeout
        signatures: Dict[int, Any] = {}
        remaining = num_samples
        while remaining > 0:
            # Natively (`reverb_client::sampler::sample_shards`): the shards' weights, the
            # draws, the samples and their global probabilities; all of them at once, or one
            # at a time where sampling deletes items (so stopping early consumes nothing).
            left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            samples, shards, failure, missing = _native.sample_shards(
                [c._client for c in self._shards], sorted(self._missing), table, remaining, left
            )
            self._missing = set(missing)
            for (info, columns), shard in zip(samples, shards):
                signature = None
                if unpack_as_table_signature:
                    if shard not in signatures:
                        signatures[shard] = self._shards[shard]._signature(table, left)
                    signature = signatures[shard]
                yield client_lib.to_sample(info, columns, emit_timesteps, signature)
            if failure is not None:
                raise failure
            if not samples:
                raise errors.ReverbError(f"No sample of table '{table}' came back from the shards")
            remaining -= len(samples)

    def mutate_priorities(
        self,
        table: str,
        updates: Optional[Dict[int, float]] = None,
        deletes: Optional[List[int]] = None,
        *,
        timeout: Optional[float] = None,
    ) -> None:
        """`Client.mutate_priorities`, each key sent only to the shard that holds it when a
        `ShardedClient` wrote it, and to every shard otherwise. Unknown keys are ignored."""
        n = len(self._shards)
        per_shard: Dict[int, tuple] = {}

        def targets(key: int) -> range:
            shard = key_shard(key) if self._route else None
            return range(shard, shard + 1) if shard is not None and shard < n else range(n)

        for key, priority in (updates or {}).items():
            for shard in targets(key):
                per_shard.setdefault(shard, ({}, []))[0][int(key)] = priority
        for key in deletes or []:
            for shard in targets(key):
                per_shard.setdefault(shard, ({}, []))[1].append(int(key))
        for shard, (shard_updates, shard_deletes) in sorted(per_shard.items()):
            self._shards[shard].mutate_priorities(
                table, shard_updates, shard_deletes, timeout=timeout
            )

    def reset(self, table: str, *, timeout: Optional[float] = None) -> None:
        """Empties `table` on every shard (and resets its rate limiters)."""
        for shard in self._shards:
            shard.reset(table, timeout=timeout)

    def checkpoint(self, *, timeout: Optional[float] = None) -> List[str]:
        """Checkpoints every shard; returns their paths, in shard order."""
        return [shard.checkpoint(timeout=timeout) for shard in self._shards]

    def shard_info(
        self, timeout: Optional[float] = None
    ) -> List[Union[Dict[str, reverb_types.TableInfo], errors.ReverbError]]:
        """Per shard, in shard order: its tables (as `Client.server_info`), or the error that
        asking it raised (e.g. `UnavailableError` for a shard that is down). The shards are
        asked at once; `timeout` in seconds (None or 0: no deadline)."""
        answers = self._server_info_all(timeout)
        out: List[Any] = []
        for answer in answers:
            if isinstance(answer, BaseException):
                out.append(answer)
                continue
            protos = [_proto.TableInfo.FromString(info.serialized()) for info in answer]
            out.append({p.name: reverb_types.TableInfo.from_proto(p) for p in protos})
        return out

    def _server_info_all(self, timeout: Optional[float]) -> List[Any]:
        clients = [c._client for c in self._shards]
        return _native.server_info_all(clients, [timeout or None] * len(clients))

    def server_info(self, timeout: Optional[float] = None) -> Dict[str, reverb_types.TableInfo]:
        """Every table's `TableInfo` over the shards that answered: sizes, episode and sample
        counts and `max_size` summed; options, signature and rate limiter (each shard has
        its own) as the first shard that answered reports them. `shard_info` has each
        shard's own. Raises the first shard's error when none answered."""
        answers = self._server_info_all(timeout)
        merged: Dict[str, Any] = {}
        for answer in answers:
            if isinstance(answer, BaseException):
                continue
            for native in answer:
                info = _proto.TableInfo.FromString(native.serialized())
                total = merged.get(info.name)
                if total is None:
                    merged[info.name] = info
                    continue
                for field in (
                    "max_size",
                    "current_size",
                    "num_episodes",
                    "num_deleted_episodes",
                    "num_unique_samples",
                ):
                    setattr(total, field, getattr(total, field) + getattr(info, field))
        if not merged and all(isinstance(a, BaseException) for a in answers):
            raise answers[0]
        return {name: reverb_types.TableInfo.from_proto(p) for name, p in merged.items()}


def _rebuild(
    addresses: List[str],
    auth_token: Optional[str],
    placement: Any,
    tls: Dict[str, Any],
    route: bool = True,
) -> ShardedClient:
    return ShardedClient(
        addresses, auth_token, placement=placement, route_priority_updates=route, **tls
    )


class ShardedTrajectoryWriter:
    """A `TrajectoryWriter` whose episodes go to the shards in turn (see
    `ShardedClient.trajectory_writer`). Everything but `end_episode`, `flush` and `close`
    acts on the current episode's shard."""

    def __init__(
        self,
        client: ShardedClient,
        make: Callable[[int], trajectory_writer_lib.TrajectoryWriter],
        shard: int,
        writer: trajectory_writer_lib.TrajectoryWriter,
    ) -> None:
        self._client = client
        self._make = make
        self._shard = shard
        self._writers: Dict[int, trajectory_writer_lib.TrajectoryWriter] = {shard: writer}
        # `configure` calls, replayed on each shard's writer after its first append.
        self._configs: List[tuple] = []
        self._configured: set = {shard}

    @property
    def shard(self) -> int:
        """The index of the shard the current episode goes to."""
        return self._shard

    @property
    def _current(self) -> trajectory_writer_lib.TrajectoryWriter:
        if self._shard not in self._writers:  # (made when first used)
            self._writers[self._shard] = self._make(self._shard)
        return self._writers[self._shard]

    def append(self, data: Any, *, partial_step: bool = False) -> Any:
        """`TrajectoryWriter.append` to the current episode."""
        result = self._current.append(data, partial_step=partial_step)
        self._replay_configs()
        return result

    def append_steps(self, data: Any) -> None:
        """`TrajectoryWriter.append_steps` to the current episode."""
        self._current.append_steps(data)
        self._replay_configs()

    def _replay_configs(self) -> None:
        if self._shard not in self._configured:
            self._configured.add(self._shard)
            for args, kwargs in self._configs:
                self._current.configure(*args, **kwargs)

    def create_item(self, table: str, priority: float, trajectory: Any) -> None:
        """`TrajectoryWriter.create_item` in the current episode's shard."""
        self._current.create_item(table, priority, trajectory)

    def configure(self, *args: Any, **kwargs: Any) -> None:
        """`TrajectoryWriter.configure`, for this episode's shard and every later one."""
        self._current.configure(*args, **kwargs)
        self._configs.append((args, kwargs))
        for shard, writer in self._writers.items():
            if shard == self._shard:
                continue
            if writer._structure is None:  # no append yet: replayed after its first
                self._configured.discard(shard)
            else:
                writer.configure(*args, **kwargs)

    @property
    def history(self) -> Any:
        """The current episode's history (`TrajectoryWriter.history`)."""
        return self._current.history

    @property
    def episode_steps(self) -> int:
        """Steps appended to the current episode."""
        return self._current.episode_steps

    @property
    def num_unconfirmed_items(self) -> int:
        """Items sent to any shard and not yet confirmed."""
        return sum(w.num_unconfirmed_items for w in self._writers.values())

    def flush(self, block_until_num_items: int = 0, timeout_ms: Optional[int] = None) -> None:
        """Sends everything pending on every shard; waits until at most
        `block_until_num_items` items of the current shard are unconfirmed (and none of the
        others)."""
        for shard, writer in self._writers.items():
            if shard != self._shard:
                writer.flush(0, timeout_ms)
        self._current.flush(block_until_num_items, timeout_ms)

    def end_episode(self, clear_buffers: bool = True, timeout_ms: Optional[int] = None) -> None:
        """`TrajectoryWriter.end_episode`; with `clear_buffers`, the next episode goes to the
        next shard."""
        try:
            self._current.end_episode(clear_buffers, timeout_ms)
        finally:
            # (Also when that failed, e.g. its shard is down: the next episode goes on.)
            if clear_buffers:
                self._shard = self._client._round_robin()

    def close(self) -> None:
        """Closes every shard's writer (after sending what is pending)."""
        failure: Optional[BaseException] = None
        for writer in self._writers.values():
            try:
                writer.close()
            except Exception as e:  # close the others first
                failure = failure or e
        if failure is not None:
            raise failure

    def __enter__(self) -> ShardedTrajectoryWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # As `TrajectoryWriter`'s, for every shard's writer.
        failure: Optional[BaseException] = None
        for writer in self._writers.values():
            try:
                writer.__exit__(exc_type, exc, tb)
            except Exception as e:  # the others first
                failure = failure or e
        if failure is not None:
            raise failure
