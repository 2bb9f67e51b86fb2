"""Types shared across the API (`TableInfo`, spec nests)."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Union

from reverb import _proto, _signature, item_selectors

# The selector classes, by the reference's names.
Fifo = item_selectors.Fifo
Heap = item_selectors.HeapSelector
Lifo = item_selectors.Lifo
Prioritized = item_selectors.Prioritized
Uniform = item_selectors.Uniform
SelectorType = Union[Fifo, Heap, Lifo, Prioritized, Uniform]

SpecNest = Any
Priority = float


@dataclasses.dataclass
class TableInfo:
    """What `Table.info` and `Client.server_info` report about a table."""

    name: str
    sampler_options: Any  # KeyDistributionOptions proto
    remover_options: Any  # KeyDistributionOptions proto
    max_size: int
    max_times_sampled: int
    rate_limiter_info: Any  # RateLimiterInfo proto
    signature: Optional[SpecNest]
    current_size: int
    num_episodes: int
    num_deleted_episodes: int
    num_unique_samples: int
    table_worker_time: Any  # TableWorkerTime proto

    @classmethod
    def from_serialized_proto(cls, proto_string: bytes) -> TableInfo:
        """Builds a TableInfo from a serialized `deepmind.reverb.TableInfo`."""
        return cls.from_proto(_proto.TableInfo.FromString(proto_string))

    @classmethod
    def from_proto(cls, proto: Any) -> TableInfo:
        """Builds a TableInfo from a `deepmind.reverb.TableInfo` message (decoding its
        signature needs TensorFlow when there is one)."""
        return cls(
            name=proto.name,
            sampler_options=proto.sampler_options,
            remover_options=proto.remover_options,
            max_size=proto.max_size,
            max_times_sampled=proto.max_times_sampled,
            rate_limiter_info=proto.rate_limiter_info,
            signature=_signature.decode(proto.signature),
            current_size=proto.current_size,
            num_episodes=proto.num_episodes,
            num_deleted_episodes=proto.num_deleted_episodes,
            num_unique_samples=proto.num_unique_samples,
            table_worker_time=proto.table_worker_time,
        )
