"""The StructuredWriter config messages (`deepmind.reverb`), as in the reference's
`reverb.cc.patterns_pb2`."""

from reverb._proto import (  # noqa: F401
    Condition,
    PatternNode,
    Priority,
    StructuredWriterConfig,
)
