"""`TrajectoryDataset`: a `tf.data.Dataset` of sampled items (one `ReplaySample` per item)."""

from reverb import _dataset


class TrajectoryDataset(_dataset.ReverbDatasetBase):
    """Streams items of `table` from `server_address`, each as
    `ReplaySample(info=SampleInfo(...), data=<nest of tensors shaped like shapes>)`.

    `TrajectoryDataset(server_address, table, dtypes, shapes, max_in_flight_samples_per_worker,
    num_workers_per_iterator=-1, max_samples_per_stream=-1, rate_limiter_timeout_ms=-1,
    max_samples=-1)`, or `TrajectoryDataset.from_table_signature(server_address, table, ...)`.

    Each iterator runs its own native sampler with `num_workers_per_iterator` workers (-1: two),
    each keeping `max_in_flight_samples_per_worker` samples requested, so network latency is
    hidden inside the client. Iteration ends cleanly after `max_samples` samples, or when the
    table's rate limiter blocks a sample for `rate_limiter_timeout_ms` (-1: wait forever).
    `max_samples_per_stream` is accepted for compatibility (streams are not recycled).
    """


__all__ = ["TrajectoryDataset"]
