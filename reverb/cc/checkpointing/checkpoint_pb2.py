"""The checkpoint messages (`deepmind.reverb`), as in the reference's
`reverb.cc.checkpointing.checkpoint_pb2` (tables of a `ReverbServerConfig` are
`PriorityTableCheckpoint`s)."""

from reverb._proto import (  # noqa: F401
    PriorityTableCheckpoint,
    RateLimiterCheckpoint,
)
