"""`ReplaySample` and `SampleInfo`: what sampling returns."""

from __future__ import annotations

from typing import Any, NamedTuple


class SampleInfo(NamedTuple):
    """Metadata of a sampled item."""

    key: Any
    probability: Any
    table_size: Any
    priority: Any
    times_sampled: Any

    @classmethod
    def tf_dtypes(cls) -> SampleInfo:
        """TensorFlow dtypes of the fields (needs TensorFlow)."""
        import tensorflow as tf

        return cls(tf.uint64, tf.double, tf.int64, tf.double, tf.int32)

    @classmethod
    def tf_shapes(cls) -> SampleInfo:
        """TensorFlow shapes of the fields: all scalars (needs TensorFlow)."""
        import tensorflow as tf

        return cls(*[tf.TensorShape([]) for _ in cls._fields])

    @classmethod
    def zeros(cls) -> SampleInfo:
        """An info of zero tensors (needs TensorFlow)."""
        import tensorflow as tf

        return cls(*[tf.zeros([], dtype) for dtype in cls.tf_dtypes()])


class ReplaySample(NamedTuple):
    """A sampled item: `info` plus `data` (a flat list or a nest of arrays)."""

    info: SampleInfo
    data: Any
