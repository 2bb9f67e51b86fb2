"""Item selectors: how a table picks the item to sample or to remove.

`Uniform` O(1); `Prioritized(priority_exponent)` O(log n) over a sum tree with probability
p^a / sum(p^a) (0^a = 0; all-zero priorities fall back to uniform); `Fifo`, `Lifo`; `MinHeap`,
`MaxHeap` (ties go to the least recently inserted or updated item).
"""

from __future__ import annotations

from reverb import _native

# The kinds the native table knows (a `_native.Selector` constructor each).
_KINDS = ("uniform", "fifo", "lifo", "min_heap", "max_heap")


class ItemSelector:
    """Base class of the selectors; `_native()` is what the native table takes."""

    _kind = ""

    def __init__(self) -> None:
        self._spec: tuple[str, float] = (self._kind, 0.0)

    def _native(self) -> _native.Selector:
        """The selector as the native table takes it."""
        if self._kind not in _KINDS:
            raise ValueError(f"{self!r} is not a selector a table can use")
        return getattr(_native.Selector, self._kind)()

    def __repr__(self) -> str:
        return f"{type(self).__name__}Selector()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ItemSelector) and self._spec == other._spec

    def __hash__(self) -> int:
        return hash(self._spec)


class Uniform(ItemSelector):
    """Samples every item with equal probability."""

    _kind = "uniform"


class Prioritized(ItemSelector):
    """Samples items with probability proportional to priority ** priority_exponent."""

    _kind = "prioritized"

    def __init__(self, priority_exponent: float) -> None:
        priority_exponent = float(priority_exponent)
        if not priority_exponent >= 0 or priority_exponent == float("inf"):
            raise ValueError(
                f"priority_exponent must be a finite number >= 0, got {priority_exponent}"
            )
        self.priority_exponent = priority_exponent
        self._spec = (self._kind, priority_exponent)

    def _native(self) -> _native.Selector:
        return _native.Selector.prioritized(priority_exponent=self.priority_exponent)

    def __repr__(self) -> str:
        return f"PrioritizedSelector(priority_exponent={self.priority_exponent:g})"


class Fifo(ItemSelector):
    """Selects the oldest item."""

    _kind = "fifo"


class Lifo(ItemSelector):
    """Selects the newest item."""

    _kind = "lifo"


class HeapSelector(ItemSelector):
    """The class of `MinHeap()` and `MaxHeap()` (the reference's `pybind.HeapSelector`);
    `HeapSelector(min_heap)` is one of them."""

    def __init__(self, min_heap: bool = True) -> None:
        if type(self) is HeapSelector:
            self._kind = "min_heap" if min_heap else "max_heap"
            self._sign = 1 if min_heap else -1
        super().__init__()

    _sign = 1

    def __repr__(self) -> str:
        return f"HeapSelector(sign={self._sign})"


class MinHeap(HeapSelector):
    """Selects the item with the lowest priority."""

    _kind = "min_heap"
    _sign = 1


class MaxHeap(HeapSelector):
    """Selects the item with the highest priority."""

    _kind = "max_heap"
    _sign = -1
