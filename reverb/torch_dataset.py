"""`TorchDataset`: the prefetching sampler as a `torch.utils.data.IterableDataset` (needs
PyTorch; nothing else in `reverb` does).

    dataset = reverb.TorchDataset('localhost:8000', 'replay', batch_size=256)
    for batch in torch.utils.data.DataLoader(dataset, batch_size=None):
        batch.info.key        # torch.uint64 [256]
        batch.data            # list (or table-signature nest) of tensors [256, ...]

Batches are made by the native sampler, so give the `DataLoader` `batch_size=None`. Tensors
share memory with the sampled arrays (no copy). With `num_workers > 0`, each worker process
runs its own sampler and `max_samples` is split between them.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from reverb import _nest, replay_sample
from reverb import client as client_lib
from reverb.trajectory_iterator import TrajectoryIterator, check_iterator_arguments

# SampleInfo fields' dtypes, as in the datasets: key, probability, table_size, priority,
# times_sampled.
_INFO_DTYPES = (np.uint64, np.float64, np.int64, np.float64, np.int32)


def _tensor(value: Any, dtype: Any = None) -> torch.Tensor:
    array = np.asarray(value, dtype=dtype)
    # from_numpy shares memory (scalars become 0-d tensors, copied: they are tiny).
    return torch.from_numpy(array) if array.ndim else torch.as_tensor(array)


class TorchDataset(IterableDataset):
    """Streams samples of `table` as `ReplaySample`s of torch tensors. Arguments as in
    `reverb.TrajectoryIterator` (and `reverb.TrajectoryDataset`); iteration ends after
    `max_samples` samples or when the rate limiter blocks for `rate_limiter_timeout_ms`."""

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
        super().__init__()
        check_iterator_arguments(
            batch_size,
            max_in_flight_samples_per_worker,
            num_workers_per_iterator,
            rate_limiter_timeout_ms,
            max_samples,
        )
        self._args = dict(
            batch_size=batch_size,
            max_in_flight_samples_per_worker=max_in_flight_samples_per_worker,
            num_workers_per_iterator=num_workers_per_iterator,
            rate_limiter_timeout_ms=rate_limiter_timeout_ms,
            unpack_as_table_signature=unpack_as_table_signature,
            auth_token=auth_token,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
        )
        self._address = server_address
        self._table = table
        self._max_samples = max_samples

    def _worker_max_samples(self) -> int:
        """This process's share of `max_samples` (all of it outside DataLoader workers)."""
        worker = get_worker_info()
        if worker is None or self._max_samples == -1:
            return self._max_samples
        share, extra = divmod(self._max_samples, worker.num_workers)
        return share + (worker.id < extra)

    def __iter__(self) -> Iterator[replay_sample.ReplaySample]:
        max_samples = self._worker_max_samples()
        if max_samples == 0:
            return
        with TrajectoryIterator(
            self._address, self._table, max_samples=max_samples, **self._args
        ) as samples:
            for sample in samples:
                info = replay_sample.SampleInfo(
                    *(_tensor(v, d) for v, d in zip(sample.info, _INFO_DTYPES))
                )
                yield replay_sample.ReplaySample(info, _nest.map_structure(_tensor, sample.data))


__all__ = ["TorchDataset"]
