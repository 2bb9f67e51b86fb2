"""Reverb: a replay store for reinforcement learning, API-compatible with DeepMind Reverb 0.14.

`import reverb` needs only numpy and protobuf. The TensorFlow parts (`TrajectoryDataset`,
`TimestepDataset`, `PatternDataset`, `TFClient`) import TensorFlow when first used.
"""

import importlib
from typing import Any

from reverb import (
    checkpoint,
    checkpointers,
    errors,
    item_selectors,
    platform,
    rate_limiters,
    replay_sample,
    reverb_types,
    storage,
    structured_writer,
)
from reverb import item_selectors as selectors
from reverb import structured_writer as structured
from reverb._native import __version__
from reverb.batch_writer import BatchWriter
from reverb.client import Client, Writer
from reverb.errors import DeadlineExceededError, ReverbError
from reverb.replay_sample import ReplaySample, SampleInfo
from reverb.server import Server, Table
from reverb.sharded_client import ShardedClient
from reverb.storage import DiskStorage
from reverb.trajectory_iterator import TrajectoryIterator
from reverb.trajectory_writer import TrajectoryColumn, TrajectoryWriter
from reverb.vector_trajectory_writer import VectorTrajectoryWriter

# Names whose modules import TensorFlow (or PyTorch): loaded on first access (PEP 562).
_LAZY = {
    "PatternDataset": "reverb.pattern_dataset",
    "TFClient": "reverb.tf_client",
    "TorchDataset": "reverb.torch_dataset",
    "TimestepDataset": "reverb.timestep_dataset",
    "TrajectoryDataset": "reverb.trajectory_dataset",
    "tf_client": "reverb.tf_client",
    "pattern_dataset": "reverb.pattern_dataset",
    "timestep_dataset": "reverb.timestep_dataset",
    "trajectory_dataset": "reverb.trajectory_dataset",
    "torch_dataset": "reverb.torch_dataset",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'reverb' has no attribute {name!r}")
    loaded = importlib.import_module(module)
    value = loaded if module.endswith(name) else getattr(loaded, name)
    globals()[name] = value
    return value


__all__ = [
    "BatchWriter",
    "Client",
    "PatternDataset",
    "DeadlineExceededError",
    "DiskStorage",
    "ReplaySample",
    "ReverbError",
    "SampleInfo",
    "Server",
    "ShardedClient",
    "TFClient",
    "Table",
    "TimestepDataset",
    "TorchDataset",
    "TrajectoryColumn",
    "TrajectoryDataset",
    "TrajectoryIterator",
    "TrajectoryWriter",
    "VectorTrajectoryWriter",
    "Writer",
    "__version__",
    "checkpoint",
    "checkpointers",
    "errors",
    "item_selectors",
    "platform",
    "rate_limiters",
    "replay_sample",
    "reverb_types",
    "selectors",
    "storage",
    "structured",
    "structured_writer",
]
