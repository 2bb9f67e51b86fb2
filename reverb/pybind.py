"""The names of the reference's native module (`reverb.pybind`) that user code touches: the
selector classes (`HeapSelector` is the class of `MinHeap()` and `MaxHeap()`),
`Sampler.NUM_INFO_TENSORS`, the `Checkpointer` a checkpointer's `internal_checkpointer()`
returns (and `create_default_checkpointer`, which makes one), the chunker options,
`WeakCellRef` (the cells of a trajectory writer's history), and the native classes behind
the Python ones (`Table` is the class of `reverb.Table(...).internal_table`, `RateLimiter` of
a limiter's `internal_limiter`; `Client`, `Server`, `TrajectoryWriter`, `StructuredWriter`).
No TensorFlow needed."""

from __future__ import annotations

import dataclasses
from typing import Optional

from reverb import _native, item_selectors, trajectory_writer

ItemSelector = item_selectors.ItemSelector
UniformSelector = item_selectors.Uniform
PrioritizedSelector = item_selectors.Prioritized
FifoSelector = item_selectors.Fifo
LifoSelector = item_selectors.Lifo
HeapSelector = item_selectors.HeapSelector
WeakCellRef = trajectory_writer.CellRef

Client = _native.Client
Server = _native.Server
Table = _native.Table
RateLimiter = _native.RateLimiter
TrajectoryWriter = _native.TrajectoryWriter
StructuredWriter = _native.StructuredWriter


class Sampler:
    """Constants of the reference's sampler."""

    # key, probability, table_size, priority, times_sampled.
    NUM_INFO_TENSORS = 5


@dataclasses.dataclass(frozen=True)
class Checkpointer:
    """Where a server saves checkpoints: `path`, the checkpoint restored when `path` has
    none (`fallback_checkpoint_path`), and how many to keep (ours)."""

    path: str
    fallback_checkpoint_path: Optional[str] = None
    keep_latest: int = 1

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("path must be a non-empty string")
        if self.keep_latest < 1:
            raise ValueError(f"keep_latest ({self.keep_latest}) must be >= 1")


def create_default_checkpointer(
    name: str, group: str = "", fallback_checkpoint_path: Optional[str] = None
) -> Checkpointer:
    """The checkpointer of `DefaultCheckpointer(name, group, fallback_checkpoint_path)`."""
    path = f"{name.rstrip('/')}/{group}" if group else name
    return Checkpointer(path, fallback_checkpoint_path)


@dataclasses.dataclass(frozen=True)
class ConstantChunkerOptions:
    """Chunks of `max_chunk_length` steps, `num_keep_alive_refs` cells kept referenceable."""

    max_chunk_length: int
    num_keep_alive_refs: int


@dataclasses.dataclass(frozen=True)
class AutoTunedChunkerOptions:
    """Automatically sized chunks, `num_keep_alive_refs` cells kept referenceable
    (`throughput_weight` is accepted; our chunk length follows the row size)."""

    num_keep_alive_refs: int
    throughput_weight: float = 1.0
