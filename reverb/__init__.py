"""Reverb: a replay store for reinforcement learning, API-compatible with DeepMind Reverb 0.14.

`import reverb` needs only numpy and protobuf; TensorFlow is imported lazily, where used.
"""

from reverb import (
    checkpointers,
    errors,
    item_selectors,
    rate_limiters,
    replay_sample,
    reverb_types,
)
from reverb import item_selectors as selectors
from reverb._native import __version__
from reverb.client import Client
from reverb.errors import DeadlineExceededError, ReverbError
from reverb.replay_sample import ReplaySample, SampleInfo
from reverb.server import Server, Table
from reverb.trajectory_iterator import TrajectoryIterator
from reverb.trajectory_writer import TrajectoryColumn, TrajectoryWriter

__all__ = [
    "Client",
    "DeadlineExceededError",
    "ReplaySample",
    "ReverbError",
    "SampleInfo",
    "Server",
    "Table",
    "TrajectoryColumn",
    "TrajectoryIterator",
    "TrajectoryWriter",
    "__version__",
    "checkpointers",
    "errors",
    "item_selectors",
    "rate_limiters",
    "replay_sample",
    "reverb_types",
    "selectors",
]
