"""`TimestepDataset`: a `tf.data.Dataset` of the single steps of sampled items."""

from reverb import _dataset


class TimestepDataset(_dataset.ReverbDatasetBase):
    """Streams the steps of items of `table` from `server_address`, one step per element, as
    `ReplaySample(info=<the item's SampleInfo>, data=<nest of one step, shaped like shapes>)`.

    Same arguments and `from_table_signature` as `reverb.TrajectoryDataset`; `shapes` are the
    shapes of one step. Every column of a sampled item must have the same number of steps.
    """

    _timestep = True


__all__ = ["TimestepDataset"]
