"""`TrajectoryIterator`: the dataset's prefetching sampler as a plain Python iterator of numpy
arrays, with no TensorFlow: for PyTorch, JAX or numpy learners.

    for batch in reverb.TrajectoryIterator('localhost:8000', 'replay', batch_size=256):
        batch.info.key        # uint64[256]
        batch.data            # list (or table-signature nest) of arrays [256, ...]
"""

from __future__ import annotations

from typing import Any, Iterator, List, Optional, Sequence, Union

from reverb import _dtypes, _native, _nest, replay_sample, sharded_client
from reverb import client as client_lib


def check_sampler_arguments(
    max_in_flight_samples_per_worker: int,
    num_workers_per_iterator: int,
    max_samples_per_stream: int,
    rate_limiter_timeout_ms: int,
    max_samples: int,
) -> None:
    """The reference's ValueErrors for bad sampler arguments (shared with the datasets)."""
    if max_in_flight_samples_per_worker < 1:
        raise ValueError(
            f"max_in_flight_samples_per_worker ({max_in_flight_samples_per_worker}) must be a "
            "positive integer"
        )
    for name, value in (
        ("num_workers_per_iterator", num_workers_per_iterator),
        ("max_samples_per_stream", max_samples_per_stream),
        ("max_samples", max_samples),
    ):
        if value < 1 and value != -1:
            raise ValueError(f"{name} ({value}) must be a positive integer or -1")
    if rate_limiter_timeout_ms < -1:
        raise ValueError(
            f"rate_limiter_timeout_ms ({rate_limiter_timeout_ms}) must be an integer >= -1"
        )


def check_iterator_arguments(
    batch_size: Optional[int],
    max_in_flight_samples_per_worker: int,
    num_workers_per_iterator: int,
    rate_limiter_timeout_ms: int,
    max_samples: int,
) -> None:
    """ValueErrors for bad iterator arguments (shared with `TorchDataset`)."""
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size ({batch_size}) must be None or >= 1")
    check_sampler_arguments(
        max_in_flight_samples_per_worker,
        num_workers_per_iterator,
        -1,
        rate_limiter_timeout_ms,
        max_samples,
    )


class TrajectoryIterator:
    """Streams samples of `table` from the server at `server_address`; given a list of
    addresses, from those servers as one table (shards; see `reverb.ShardedClient`).

    Workers keep `max_in_flight_samples_per_worker` samples requested (with `batch_size`, at
    least a batch), decode them natively and queue them, so the network round trip is hidden
    from the consumer; the next element is assembled in the background while the consumer uses
    the last one. With `batch_size`, each element stacks that many samples (every column gains
    a leading batch dimension; the last batch may be smaller), and our servers send them as
    columns; without it, elements are single samples with whole columns.
    Iteration ends after `max_samples` samples, or cleanly when the table's rate limiter
    blocks for `rate_limiter_timeout_ms` (-1: wait forever). Arguments as in
    `reverb.TrajectoryDataset`.
    """

    def __init__(
        self,
        server_address: Union[str, Sequence[str]],
        table: str,
        *,
        batch_size: Optional[int] = None,
        max_in_flight_samples_per_worker: int = 100,
        num_workers_per_iterator: int = -1,
        max_samples: int = -1,
        rate_limiter_timeout_ms: int = -1,
        unpack_as_table_signature: bool = False,
        auth_token: Optional[str] = None,
        tls_ca: Optional[client_lib.PathLike] = None,
        tls_cert: Optional[client_lib.PathLike] = None,
        tls_key: Optional[client_lib.PathLike] = None,
    ) -> None:
        check_iterator_arguments(
            batch_size,
            max_in_flight_samples_per_worker,
            num_workers_per_iterator,
            rate_limiter_timeout_ms,
            max_samples,
        )
        tls = dict(tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key)
        if isinstance(server_address, str):
            self._client = client_lib.Client(server_address, auth_token, **tls)
            clients = [self._client]
        else:
            # Several servers (shards): sampled as one table (see `reverb.ShardedClient`).
            sharded = sharded_client.ShardedClient(server_address, auth_token, **tls)
            clients = sharded.shards
            self._client = clients[0]
        self._table = table
        self._batch_size = batch_size
        self._signature = (
            self._client._signature(table, None) if unpack_as_table_signature else None
        )
        # -1: the native sampler picks (two workers, one per client thread).
        workers = 0 if num_workers_per_iterator == -1 else num_workers_per_iterator
        self._sampler: Optional[_native.Sampler] = _native.Sampler(
            [c._client for c in clients],
            table,
            n=batch_size or 1,
            stacked=batch_size is not None,
            max_in_flight_samples_per_worker=max_in_flight_samples_per_worker,
            num_workers=workers,
            max_samples=max_samples,
            rate_limiter_timeout_ms=rate_limiter_timeout_ms,
        )

    def __iter__(self) -> Iterator[replay_sample.ReplaySample]:
        return self

    def __next__(self) -> replay_sample.ReplaySample:
        if self._sampler is None:
            raise StopIteration
        got = self._sampler.next()
        if got is None:
            self.close()
            raise StopIteration
        if self._batch_size is None:
            ((info, columns),) = got
        else:
            info, columns = got
        return replay_sample.ReplaySample(info, self._pack(columns))

    def _pack(self, columns: list) -> Any:
        arrays = [_dtypes.from_column(c) for c in columns]
        return (
            arrays if self._signature is None else _nest.pack_sequence_as(self._signature, arrays)
        )

    @property
    def missing_shards(self) -> List[str]:
        """Addresses of the shards that cannot be reached now (sampling goes on from the
        others); always empty for one server."""
        return [] if self._sampler is None else self._sampler.missing_shards()

    def close(self) -> None:
        """Stops the workers (also done when the iterator is garbage collected)."""
        sampler = getattr(self, "_sampler", None)  # (absent if __init__ raised)
        if sampler is not None:
            sampler.close()
            self._sampler = None

    def __enter__(self) -> TrajectoryIterator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


__all__ = ["TrajectoryIterator"]
