"""The schema messages (`deepmind.reverb`), as in the reference's `reverb.cc.schema_pb2`."""

from reverb._proto import (  # noqa: F401
    ChunkData,
    FlatTrajectory,
    KeyDistributionOptions,
    PrioritizedItem,
    RateLimiterInfo,
    SampleInfo,
    TableInfo,
    TableWorkerTime,
)
