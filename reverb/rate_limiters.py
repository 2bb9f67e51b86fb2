"""Rate limiters: when a table allows inserts and samples.

With counters `inserts`, `samples`, `deletes` (all since the last reset):

    can_sample(n): inserts - deletes >= min_size_to_sample
                   and inserts * samples_per_insert - samples - n >= min_diff
    can_insert(n): inserts + n - deletes <= min_size_to_sample
                   or (inserts + n) * samples_per_insert - samples <= max_diff
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Tuple, Union

from reverb import _native


class RateLimiter:
    """A rate limiter with explicit bounds (the subclasses are the usual way to build one)."""

    def __init__(
        self,
        samples_per_insert: float,
        min_size_to_sample: int,
        min_diff: float,
        max_diff: float,
    ) -> None:
        if min_size_to_sample < 1:
            raise ValueError(
                f"min_size_to_sample ({min_size_to_sample}) must be a positive integer"
            )
        if not samples_per_insert > 0:
            raise ValueError(f"samples_per_insert ({samples_per_insert}) must be > 0")
        if not min_diff <= max_diff:
            raise ValueError(f"min_diff ({min_diff}) must be <= max_diff ({max_diff})")
        self.samples_per_insert = float(samples_per_insert)
        self.min_size_to_sample = int(min_size_to_sample)
        self.min_diff = float(min_diff)
        self.max_diff = float(max_diff)

    @property
    def _params(self) -> tuple[float, int, float, float]:
        return (self.samples_per_insert, self.min_size_to_sample, self.min_diff, self.max_diff)

    @functools.cached_property
    def internal_limiter(self) -> _native.RateLimiter:
        """The native limiter (`reverb.pybind.RateLimiter`) a table is built with."""
        return self._native()

    def _native(self) -> _native.RateLimiter:
        """The bounds as the native table takes them."""
        return _native.RateLimiter(
            samples_per_insert=self.samples_per_insert,
            min_size_to_sample=self.min_size_to_sample,
            min_diff=self.min_diff,
            max_diff=self.max_diff,
        )

    def __repr__(self) -> str:
        return (
            f"RateLimiter(samples_per_insert={self.samples_per_insert:g}, "
            f"min_size_to_sample={self.min_size_to_sample}, "
            f"min_diff={self.min_diff:g}, max_diff={self.max_diff:g})"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RateLimiter) and self._params == other._params

    def __hash__(self) -> int:
        return hash(self._params)


class MinSize(RateLimiter):
    """Blocks sampling until the table holds `min_size_to_sample` items; never blocks inserts."""

    def __init__(self, min_size_to_sample: int) -> None:
        if min_size_to_sample < 1:
            raise ValueError(
                f"min_size_to_sample ({min_size_to_sample}) must be a positive integer"
            )
        super().__init__(
            samples_per_insert=1.0,
            min_size_to_sample=min_size_to_sample,
            min_diff=-sys.float_info.max,
            max_diff=sys.float_info.max,
        )


class SampleToInsertRatio(RateLimiter):
    """Keeps samples per insert near `samples_per_insert`, within `error_buffer`.

    A scalar `error_buffer` allows `samples_per_insert * min_size_to_sample +- error_buffer`;
    a `(min_diff, max_diff)` pair is used as is.
    """

    def __init__(
        self,
        samples_per_insert: float,
        min_size_to_sample: int,
        error_buffer: Union[float, Tuple[float, float]],
    ) -> None:
        if isinstance(error_buffer, (int, float)):
            offset = samples_per_insert * min_size_to_sample
            min_diff = offset - error_buffer
            max_diff = offset + error_buffer
        else:
            min_diff, max_diff = error_buffer
        if samples_per_insert <= 0:
            raise ValueError(f"samples_per_insert ({samples_per_insert}) must be > 0")
        if max_diff - min_diff < 2 * max(1.0, samples_per_insert):
            raise ValueError(
                "The size of error_buffer must be >= max(1.0, samples_per_insert) as "
                "smaller values could completely block samples and/or insert calls."
            )
        if max_diff < samples_per_insert * min_size_to_sample:
            logging.warning(
                "The range covered by the limiter is below the min_size_to_sample threshold: "
                "max_diff (%s) < samples_per_insert (%s) * min_size_to_sample (%s). Inserts "
                "may block before sampling is possible.",
                max_diff,
                samples_per_insert,
                min_size_to_sample,
            )
        if min_diff > samples_per_insert * min_size_to_sample:
            raise ValueError(
                f"The upper bound of the error buffer (min_diff={min_diff}) is larger than "
                f"samples_per_insert * min_size_to_sample "
                f"({samples_per_insert * min_size_to_sample}): sampling would deadlock once "
                "the table reaches min_size_to_sample items."
            )
        if min_size_to_sample < 1:
            raise ValueError(
                f"min_size_to_sample ({min_size_to_sample}) must be a positive integer"
            )
        super().__init__(
            samples_per_insert=samples_per_insert,
            min_size_to_sample=min_size_to_sample,
            min_diff=min_diff,
            max_diff=max_diff,
        )


class Queue(RateLimiter):
    """Rate limiter of `Table.queue`: inserts block when `size` items wait, samples when none."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size ({size}) must be a positive integer")
        super().__init__(samples_per_insert=1.0, min_size_to_sample=1, min_diff=0.0, max_diff=size)


class Stack(RateLimiter):
    """Rate limiter of `Table.stack` (same bounds as `Queue`)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size ({size}) must be a positive integer")
        super().__init__(samples_per_insert=1.0, min_size_to_sample=1, min_diff=0.0, max_diff=size)
