"""What `TrajectoryDataset` and `TimestepDataset` share: argument checks and the `tf.data`
pipeline around the sampling kernel.

The kernel (`ReverbRsDatasetSample`, one per iterator) owns a prefetching native sampler; each
call returns all samples already queued, and fails with OUT_OF_RANGE at the end. The pipeline is

    repeat -> V1 map(kernel) -> unbatch
    repeat -> V1 map(kernel) -> rebatch(n) (or filter) -> take(-1)     (with `.batch(n)`)

so a rate-limiter timeout or `max_samples` ends iteration cleanly (no error, nothing lost).
"""

from __future__ import annotations

import collections.abc
import contextlib
import itertools
import os
from typing import Any, Optional

import tensorflow as tf

from reverb import _native, _nest, _tf_ops, replay_sample
from reverb import client as client_lib
from reverb.trajectory_iterator import check_sampler_arguments

_tf_ops.keep_out_of_autograph()

_instances = itertools.count(1)


def constant_string(value: Any, what: str) -> str:
    """A Python string from a string or a constant string tensor."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, str):
        return value
    static = tf.get_static_value(value)
    if static is None:
        raise ValueError(f"{what} must be a string or a constant string tensor, got {value!r}")
    if getattr(static, "ndim", 0) != 0:
        raise ValueError(f"{what} must be a scalar string tensor, got {value!r}")
    static = static.item() if hasattr(static, "item") else static
    return static.decode() if isinstance(static, bytes) else str(static)


def runtime_string(value: Any, what: str) -> Optional[tf.Tensor]:
    """`value` when it is a scalar string tensor whose value is known only when the graph runs
    (a `tf.function` argument, a placeholder); None for strings and constant tensors."""
    if isinstance(value, (str, bytes, list, tuple)) or not tf.is_tensor(value):
        return None
    if tf.get_static_value(value) is not None:
        return None
    if value.dtype != tf.string or not value.shape.is_compatible_with([]):
        raise ValueError(f"{what} must be a scalar string tensor, got {value!r}")
    return value


def server_addresses(value: Any) -> str:
    """The `server_address` attr of the kernels: one address, or a list of addresses (the
    shards of one table, sampled as one; see `reverb.ShardedClient`) joined by commas."""
    if isinstance(value, (list, tuple)):
        addresses = [constant_string(a, "server_address") for a in value]
        if not addresses or any(not a or "," in a for a in addresses):
            raise ValueError(f"server_address must list addresses, got {value!r}")
        if len(set(addresses)) != len(addresses):
            raise ValueError(f"server_address has duplicates: {addresses}")
        return ",".join(addresses)
    return constant_string(value, "server_address")


def check_arguments(
    dtypes: Any,
    shapes: Any,
    max_in_flight_samples_per_worker: int,
    num_workers_per_iterator: int,
    max_samples_per_stream: int,
    rate_limiter_timeout_ms: int,
    max_samples: int,
) -> Any:
    """The reference's ValueErrors for bad dataset arguments; returns `shapes` as a nest (the
    structure of `dtypes`) of `tf.TensorShape`."""
    try:
        flat = _flat_shapes(dtypes, shapes)
    except (TypeError, ValueError, KeyError) as e:
        raise ValueError(
            f"dtypes and shapes must have the same structure ({e}): {dtypes!r} and {shapes!r}"
        ) from None
    shapes = tf.nest.pack_sequence_as(dtypes, flat)
    check_sampler_arguments(
        max_in_flight_samples_per_worker,
        num_workers_per_iterator,
        max_samples_per_stream,
        rate_limiter_timeout_ms,
        max_samples,
    )
    return shapes


def _flat_shapes(dtypes: Any, shapes: Any) -> list:
    """`shapes` flattened along the structure of `dtypes` (in `tf.nest.flatten` order); each
    leaf (a list of dims, a tuple or a `tf.TensorShape`) becomes a `tf.TensorShape`."""
    if not tf.nest.is_nested(dtypes):
        return [tf.TensorShape(shapes)]
    if isinstance(dtypes, collections.abc.Mapping):
        if not isinstance(shapes, collections.abc.Mapping) or set(shapes) != set(dtypes):
            raise ValueError("different keys")
        return [s for k in sorted(dtypes) for s in _flat_shapes(dtypes[k], shapes[k])]
    if isinstance(shapes, (str, bytes)) or len(shapes) != len(dtypes):
        raise ValueError("different lengths")
    return [s for d, sh in zip(dtypes, shapes) for s in _flat_shapes(d, sh)]


def _lists_to_tuples(structure: Any) -> Any:
    """tf.data turns lists into stacked tensors; like the reference, lists become tuples."""
    if isinstance(structure, list):
        return tuple(_lists_to_tuples(x) for x in structure)
    if isinstance(structure, dict):
        return type(structure)((k, _lists_to_tuples(v)) for k, v in structure.items())
    if isinstance(structure, tuple) and hasattr(structure, "_fields"):
        return type(structure)(*(_lists_to_tuples(x) for x in structure))
    if isinstance(structure, tuple):
        return tuple(_lists_to_tuples(x) for x in structure)
    return structure


def _column_names(dtypes: Any) -> list[str]:
    paths = ["/".join(map(str, p)) for p, _ in _nest.flatten_with_path(dtypes)]
    return [p or str(i) for i, p in enumerate(paths)]


def element_spec(
    *, dtypes: Any, shapes: Any, timestep: bool, batch_size: int = 0, drop_remainder: bool = False
) -> replay_sample.ReplaySample:
    """What the pipeline `build` makes yields: a `ReplaySample` of one item (or step), or of a
    batch of them, with `shapes` already checked by `check_arguments`."""
    lead = [batch_size if drop_remainder else None] if batch_size else []
    info = replay_sample.SampleInfo(
        *(tf.TensorSpec(lead, d) for d in replay_sample.SampleInfo.tf_dtypes())
    )
    flat = [
        tf.TensorSpec(tf.TensorShape(lead).concatenate(s), tf.as_dtype(d))
        for d, s in zip(tf.nest.flatten(dtypes), tf.nest.flatten(shapes))
    ]
    return replay_sample.ReplaySample(
        info, tf.nest.pack_sequence_as(_lists_to_tuples(dtypes), flat)
    )


def build(
    *,
    server_address: Any,
    table: Any,
    dtypes: Any,
    shapes: Any,
    max_in_flight_samples_per_worker: int,
    num_workers_per_iterator: int,
    max_samples_per_stream: int,
    rate_limiter_timeout_ms: int,
    max_samples: int,
    timestep: bool,
    batch_size: int = 0,
    drop_remainder: bool = False,
    auth_token: Optional[str] = None,
    tls_ca: Optional[client_lib.PathLike] = None,
    tls_cert: Optional[client_lib.PathLike] = None,
    tls_key: Optional[client_lib.PathLike] = None,
) -> tf.Tensor:
    """The variant tensor of the dataset whose elements `element_spec` describes: one
    `ReplaySample` per item, or per step with `timestep`; with `batch_size`, batches of that
    many items made by the kernel itself (what `.batch` on the unbatched dataset would give,
    without handling single elements in tf.data). `shapes` as `check_arguments` returns them.

    One traced function per pipeline (two in batch mode): tracing is most of what building a
    dataset costs."""
    # A tensor known only when the graph runs reaches the kernel as an input (its attr empty).
    address_input = runtime_string(server_address, "server_address")
    table_input = runtime_string(table, "table")
    address = "" if address_input is not None else server_addresses(server_address)
    table_name = "" if table_input is not None else constant_string(table, "table")
    flat_dtypes = [tf.as_dtype(d) for d in tf.nest.flatten(dtypes)]
    flat_shapes = tf.nest.flatten(shapes)
    ranks = [-1 if s.rank is None else s.rank for s in flat_shapes]
    dims = [-1 if d is None else d for s in flat_shapes if s.rank is not None for d in s.as_list()]
    # -1: the native sampler picks (two workers, one per client thread).
    workers = 0 if num_workers_per_iterator == -1 else num_workers_per_iterator
    structure = _lists_to_tuples(dtypes)
    ops = _tf_ops.ops()
    attrs = dict(
        server_address=address,
        table=table_name,
        max_in_flight_samples_per_worker=max_in_flight_samples_per_worker,
        num_workers=workers,
        max_samples=max_samples,
        rate_limiter_timeout_ms=rate_limiter_timeout_ms,
        max_batch=max(1, min(max_in_flight_samples_per_worker * max(workers, 2), 4096)),
        timestep=timestep,
        batch_size=batch_size,
        drop_remainder=drop_remainder,
        dtypes=flat_dtypes,
        ranks=ranks,
        dims=dims,
        names=_column_names(dtypes),
        # A server on this host gets a shared-memory ring for chunk bytes; REVERB_NO_SHM=1
        # keeps them on the socket.
        shared_memory=not os.environ.get("REVERB_NO_SHM"),
        # Eager mode caches one kernel per distinct attrs: keep datasets apart.
        instance=next(_instances),
        auth_token=auth_token or "",
        tls_ca=_path(tls_ca),
        tls_cert=_path(tls_cert),
        tls_key=_path(tls_key),
        **_inproc_server(address, auth_token),
    )

    @tf.autograph.experimental.do_not_convert
    def sample(_: Any) -> replay_sample.ReplaySample:
        try:
            key, probability, table_size, priority, times_sampled, data = (
                ops.reverb_rs_dataset_sample(
                    server_address_input="" if address_input is None else address_input,
                    table_input="" if table_input is None else table_input,
                    **attrs,
                )
            )
        except tf.errors.OutOfRangeError:
            # (Only in tf.data's debug mode, where this function runs eagerly: a Python
            # function ends its map with StopIteration.)
            raise StopIteration from None
        info = replay_sample.SampleInfo(key, probability, table_size, priority, times_sampled)
        for t in info:
            t.set_shape([None])
        for t, shape in zip(data, flat_shapes):
            t.set_shape(tf.TensorShape([None]).concatenate(shape))
        return replay_sample.ReplaySample(info, tf.nest.pack_sequence_as(structure, data))

    # Each call returns the rows that came. A V1 map does not preserve cardinality: the
    # kernel's OUT_OF_RANGE at the end of the samples ends the dataset cleanly.
    ds = _map(tf.compat.v1.data.Dataset.from_tensors(0).repeat(), sample)
    flat = tf.nest.flatten(element_spec(dtypes=dtypes, shapes=shapes, timestep=timestep))
    types = [s.dtype for s in flat]
    if not batch_size:
        # Rows into elements. (`Dataset.unbatch` traces a function first, for sparse
        # components.)
        return tf.raw_ops.UnbatchDataset(
            input_dataset=ds._variant_tensor,
            output_types=types,
            output_shapes=[s.shape for s in flat],
        )
    # A call that timed out waiting returns zero rows: skip them.
    if all(s.shape.is_fully_defined() for s in flat):
        # A rebatch into batches of `batch_size` hands a full batch on as it is (one slice of
        # one input: no copy, unless zero rows came before it). (With shapes not fully known,
        # a batch after zero rows could not be joined to them: filter those.)
        variant = tf.raw_ops.RebatchDatasetV2(
            input_dataset=ds._variant_tensor,
            batch_sizes=tf.constant([batch_size], tf.int64),
            drop_remainder=drop_remainder,
            output_types=types,
            output_shapes=[tf.TensorShape([None]).concatenate(s.shape) for s in flat],
        )
    else:
        nonempty = tf.autograph.experimental.do_not_convert(
            lambda batch: tf.size(batch.info.key) > 0
        )
        variant = _map(ds, nonempty, filter=True)._variant_tensor
    # Ends in a `take(-1)`, a pass-through that declares the batches' shapes (static with
    # `drop_remainder`), and keeps tf.distribute's auto-sharding from rewriting a final
    # `RebatchDatasetV2` into the legacy rebatch (which would pass the zero rows on).
    batched = element_spec(
        dtypes=dtypes,
        shapes=shapes,
        timestep=timestep,
        batch_size=batch_size,
        drop_remainder=drop_remainder,
    )
    return tf.raw_ops.TakeDataset(
        input_dataset=variant,
        count=tf.constant(-1, tf.int64),
        output_types=types,
        output_shapes=[s.shape for s in tf.nest.flatten(batched)],
    )


def _map(ds: Any, fn: Any, filter: bool = False) -> Any:
    """`ds.map(fn)` (or `.filter`) of a V1 dataset. In a TF1 graph, with a legacy function:
    tracing a `tf.function` there starts TensorFlow's runtime, after which logical devices
    can no longer be configured (the reference's single dataset op leaves that open too)."""
    graph = tf.compat.v1.get_default_graph()
    if tf.executing_eagerly() or getattr(graph, "building_function", True):
        return ds.filter(fn) if filter else ds.map(fn)
    try:
        from tensorflow.python.util import deprecation

        quiet = deprecation.silence()  # (the legacy methods log a deprecation warning)
    except (ImportError, AttributeError):
        quiet = contextlib.nullcontext()
    with quiet:
        if filter:
            return ds.filter_with_legacy_function(fn)
        return ds.map_with_legacy_function(fn)


def _path(path: Optional[client_lib.PathLike]) -> str:
    return "" if path is None else os.fspath(path)


def _inproc_server(address: str, auth_token: Optional[str]) -> dict:
    """With a server of this process at `address` (that `auth_token` may call), the kernel
    samples its tables directly (through `reverb._native`) instead of over loopback gRPC.
    `REVERB_NO_INPROC=1` turns that off."""
    if not address or "," in address:
        return dict(inproc_library="", inproc_port=0)
    port = _native.inproc_port(address, auth_token or None)
    if port is None:
        return dict(inproc_library="", inproc_port=0)
    return dict(inproc_library=os.path.abspath(_native.__file__), inproc_port=port)


def table_signature(
    server_address: Any,
    table: Any,
    get_signature_timeout_secs: Optional[float],
    auth_token: Optional[str] = None,
    **tls: Optional[client_lib.PathLike],
) -> Any:
    """The signature of `table` (a nest of `tf.TensorSpec`), or the reference's ValueErrors."""
    # (Of shards, the first one's: they share their tables' signatures.)
    address = server_addresses(server_address).split(",")[0]
    name = constant_string(table, "table")
    info = client_lib.Client(address, auth_token, **tls).server_info(get_signature_timeout_secs)
    if name not in info:
        raise ValueError(
            f"Server at {address} does not contain any table named {name}. "
            f"Found: {', '.join(sorted(info))}."
        )
    signature = info[name].signature
    if signature is None:
        raise ValueError(f"Table {name} at {address} does not have a signature.")
    return signature


class ReverbDatasetBase(tf.compat.v1.data.Dataset):
    """A `tf.compat.v1.data.Dataset` (as the reference's dataset classes are: TF1 graphs can
    make initializable and one-shot iterators; eager use is the same) of the pipeline `build`
    makes. The pipeline is built when first used, so `.batch` (done by the kernel) builds only
    its own. Subclasses choose items or steps."""

    _timestep = False

    def __init__(
        self,
        server_address: Any,
        table: Any,
        dtypes: Any,
        shapes: Any,
        max_in_flight_samples_per_worker: int,
        num_workers_per_iterator: int = -1,
        max_samples_per_stream: int = -1,
        rate_limiter_timeout_ms: int = -1,
        max_samples: int = -1,
        auth_token: Optional[str] = None,
        *,
        tls_ca: Optional[client_lib.PathLike] = None,
        tls_cert: Optional[client_lib.PathLike] = None,
        tls_key: Optional[client_lib.PathLike] = None,
    ) -> None:
        shapes = check_arguments(
            dtypes,
            shapes,
            max_in_flight_samples_per_worker,
            num_workers_per_iterator,
            max_samples_per_stream,
            rate_limiter_timeout_ms,
            max_samples,
        )
        args = dict(
            server_address=server_address,
            table=table,
            dtypes=dtypes,
            shapes=shapes,
            max_in_flight_samples_per_worker=max_in_flight_samples_per_worker,
            num_workers_per_iterator=num_workers_per_iterator,
            max_samples_per_stream=max_samples_per_stream,
            rate_limiter_timeout_ms=rate_limiter_timeout_ms,
            max_samples=max_samples,
            timestep=self._timestep,
            auth_token=auth_token,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
        )
        self._init_pipeline(args)

    def _init_pipeline(self, args: dict) -> None:
        # The attrs the kernel will get are checked now (the reference's errors come from the
        # constructor), not when the pipeline is built.
        if runtime_string(args["server_address"], "server_address") is None:
            server_addresses(args["server_address"])
        if runtime_string(args["table"], "table") is None:
            constant_string(args["table"], "table")
        self._args = args
        self._spec = element_spec(
            **{k: args[k] for k in ("dtypes", "shapes", "timestep")},
            batch_size=args.get("batch_size", 0),
            drop_remainder=args.get("drop_remainder", False),
        )
        self._variant: Optional[tf.Tensor] = None
        self._eager = tf.executing_eagerly()
        super().__init__()

    def _as_variant_tensor(self) -> None:
        return None  # (`_variant_tensor` builds it when first used)

    @property
    def _variant_tensor(self) -> tf.Tensor:
        if self._variant is None:
            if self._eager:
                # Made eagerly, used first while tracing a function: build it eagerly, as an
                # eager constructor would have, not into the function's graph.
                scope = tf.init_scope()
            elif tf.compat.v1.get_default_graph() is not self._graph:
                # Made in a graph, used first inside a function of it (a `flat_map`, a
                # `tf.cond` branch): build it in its own graph, which later uses share.
                scope = self._graph.as_default()
            else:
                scope = contextlib.nullcontext()
            with scope:
                self._variant = build(**self._args)
        return self._variant

    @_variant_tensor.setter
    def _variant_tensor(self, _: Any) -> None:
        raise ValueError("The _variant_tensor property of a Reverb dataset is read-only")

    def batch(
        self,
        batch_size: Any,
        drop_remainder: bool = False,
        num_parallel_calls: Any = None,
        deterministic: Any = None,
        name: Optional[str] = None,
    ) -> tf.data.Dataset:
        """`tf.data.Dataset.batch`, done inside the sampling kernel for item datasets: the same
        elements, without tf.data handling each sample on its own."""
        size = tf.get_static_value(batch_size)
        drop = tf.get_static_value(drop_remainder)
        if (
            self._timestep
            or self._args.get("batch_size")
            or size is None
            or drop is None
            or int(size) < 1
        ):
            return super().batch(
                batch_size, drop_remainder, num_parallel_calls, deterministic, name
            )
        batched = ReverbDatasetBase.__new__(ReverbDatasetBase)
        batched._init_pipeline(dict(self._args, batch_size=int(size), drop_remainder=bool(drop)))
        return batched

    @classmethod
    def from_table_signature(
        cls,
        server_address: Any,
        table: Any,
        max_in_flight_samples_per_worker: int,
        num_workers_per_iterator: int = -1,
        max_samples_per_stream: int = -1,
        rate_limiter_timeout_ms: int = -1,
        get_signature_timeout_secs: Optional[int] = None,
        max_samples: int = -1,
        auth_token: Optional[str] = None,
        *,
        tls_ca: Optional[client_lib.PathLike] = None,
        tls_cert: Optional[client_lib.PathLike] = None,
        tls_key: Optional[client_lib.PathLike] = None,
    ) -> Any:
        """A dataset whose dtypes and shapes are the table's signature. ValueError when the
        table does not exist or has no signature; DeadlineExceededError on timeout."""
        tls = dict(tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key)
        signature = table_signature(
            server_address, table, get_signature_timeout_secs, auth_token, **tls
        )
        return cls(
            server_address=server_address,
            table=table,
            dtypes=tf.nest.map_structure(lambda s: s.dtype, signature),
            shapes=tf.nest.map_structure(lambda s: s.shape, signature),
            max_in_flight_samples_per_worker=max_in_flight_samples_per_worker,
            num_workers_per_iterator=num_workers_per_iterator,
            max_samples_per_stream=max_samples_per_stream,
            rate_limiter_timeout_ms=rate_limiter_timeout_ms,
            max_samples=max_samples,
            auth_token=auth_token,
            **tls,
        )

    def _inputs(self) -> list:
        return []  # a source, as the reference's dataset ops are

    @property
    def element_spec(self) -> Any:
        return self._spec
