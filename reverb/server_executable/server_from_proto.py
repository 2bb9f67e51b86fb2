"""Tables from the checkpoint messages of a `ReverbServerConfig`, as the reference's
`reverb.server_executable.server_from_proto` builds them."""

from __future__ import annotations

from typing import Any, List, Sequence

from reverb import errors, item_selectors, rate_limiters, server


def selector_from_proto(options: Any) -> item_selectors.ItemSelector:
    """The selector a `KeyDistributionOptions` message describes."""
    kind = options.WhichOneof("distribution")
    if kind in ("fifo", "lifo", "uniform"):
        if not getattr(options, kind):
            raise ValueError(f"distribution={kind} but the associated boolean value is false.")
        return {
            "fifo": item_selectors.Fifo,
            "lifo": item_selectors.Lifo,
            "uniform": item_selectors.Uniform,
        }[kind]()
    if kind == "heap":
        return item_selectors.MinHeap() if options.heap.min_heap else item_selectors.MaxHeap()
    if kind == "prioritized":
        return item_selectors.Prioritized(options.prioritized.priority_exponent)
    raise NotImplementedError(f"distribution={kind}")


def rate_limiter_from_proto(proto: Any) -> rate_limiters.RateLimiter:
    """The rate limiter a `RateLimiterCheckpoint` message describes."""
    return rate_limiters.RateLimiter(
        samples_per_insert=proto.samples_per_insert,
        min_size_to_sample=proto.min_size_to_sample,
        min_diff=proto.min_diff,
        max_diff=proto.max_diff,
    )


def tables_from_proto(configs: Sequence[Any]) -> List[server.Table]:
    """The tables `PriorityTableCheckpoint` messages describe, with their signatures (as
    the reference's `reverb_server` keeps them); their items are not used. ValueError naming
    the table if a signature is not a nest of tensor specs."""
    tables = []
    for config in configs:
        signature = config.signature if config.HasField("signature") else None
        try:
            tables.append(
                server.Table(
                    name=config.table_name,
                    sampler=selector_from_proto(config.sampler),
                    remover=selector_from_proto(config.remover),
                    max_size=config.max_size,
                    rate_limiter=rate_limiter_from_proto(config.rate_limiter),
                    max_times_sampled=config.max_times_sampled,
                    signature=signature,
                )
            )
        except (errors.ReverbError, ValueError) as e:
            raise ValueError(f"table '{config.table_name}': {e}") from None
    return tables
