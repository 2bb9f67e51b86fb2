"""`TFClient`: sample, insert and update priorities from TensorFlow graphs (`tf.function`, TF1
sessions) through Reverb's C-API kernels."""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

import tensorflow as tf

from reverb import _tf_ops, replay_sample
from reverb import client as client_lib

_tf_ops.keep_out_of_autograph()


class TFClient:
    """Calls a Reverb server from TensorFlow ops. Each op holds its own connection. Not in
    the reference: `auth_token` for servers that require one (by default the
    `REVERB_AUTH_TOKEN` environment variable, when set)."""

    def __init__(
        self,
        server_address: str,
        shared_name: Optional[str] = None,
        name: str = "reverb",
        *,
        auth_token: Optional[str] = None,
        tls_ca: Optional[client_lib.PathLike] = None,
        tls_cert: Optional[client_lib.PathLike] = None,
        tls_key: Optional[client_lib.PathLike] = None,
    ) -> None:
        # `shared_name` is accepted for compatibility: there is no client resource to share.
        self._server_address = server_address
        # The connection settings every op carries.
        self._connection = dict(
            server_address=server_address,
            auth_token=auth_token or "",
            **{
                k: "" if v is None else os.fspath(v)
                for k, v in dict(tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key).items()
            },
        )
        self._name = name
        self._ops = _tf_ops.ops()

    @property
    def server_address(self) -> str:
        return self._server_address

    def sample(
        self,
        table: Any,
        data_dtypes: Any,
        name: Optional[str] = None,
        rate_limiter_timeout_ms: int = -1,
    ) -> replay_sample.ReplaySample:
        """Samples one item of `table` (blocking while its rate limiter blocks, at most
        `rate_limiter_timeout_ms` if >= 0). As in the reference, `data` holds the first step of
        each column, nested like `data_dtypes`."""
        flat = [tf.as_dtype(d) for d in tf.nest.flatten(data_dtypes)]
        with tf.name_scope(name or f"{self._name}_sample"):
            key, probability, table_size, priority, times_sampled, data = (
                self._ops.reverb_rs_client_sample(
                    table,
                    **self._connection,
                    dtypes=flat,
                    rate_limiter_timeout_ms=rate_limiter_timeout_ms,
                )
            )
        info = replay_sample.SampleInfo(key, probability, table_size, priority, times_sampled)
        return replay_sample.ReplaySample(info, tf.nest.pack_sequence_as(data_dtypes, data))

    def insert(
        self,
        data: Sequence[Any],
        tables: tf.Tensor,
        priorities: tf.Tensor,
        name: Optional[str] = None,
        timeout_ms: int = -1,
    ) -> Any:
        """Inserts `data` (one step) as an item with priority `priorities[i]` into `tables[i]`
        for every i, waiting until the server confirms it (at most `timeout_ms` if >= 0).
        Returns the op (in graph mode)."""
        if tables.dtype != tf.string or tables.shape.rank != 1:
            raise ValueError("tables must be a string tensor of rank 1")
        if priorities.dtype != tf.float64 or priorities.shape.rank != 1:
            raise ValueError("priorities must be a float64 tensor of rank 1")
        if not tables.shape.is_compatible_with(priorities.shape):
            raise ValueError("priorities and tables must have the same shape")
        with tf.name_scope(name or f"{self._name}_insert"):
            return self._ops.reverb_rs_client_insert(
                [tf.convert_to_tensor(d) for d in data],
                tables,
                priorities,
                **self._connection,
                timeout_ms=timeout_ms,
            )

    def update_priorities(
        self,
        table: Any,
        keys: tf.Tensor,
        priorities: tf.Tensor,
        name: Optional[str] = None,
        timeout_ms: int = -1,
    ) -> Any:
        """Sets `priorities[i]` on item `keys[i]` of `table`; unknown keys are ignored. Fails
        with DEADLINE_EXCEEDED after `timeout_ms` if >= 0."""
        # Shapes are checked when the op runs (InvalidArgumentError), as the reference does.
        keys = tf.convert_to_tensor(keys, tf.uint64)
        priorities = tf.convert_to_tensor(priorities, tf.float64)
        with tf.name_scope(name or f"{self._name}_update_priorities"):
            return self._ops.reverb_rs_client_update_priorities(
                table,
                keys,
                priorities,
                **self._connection,
                timeout_ms=timeout_ms,
            )


__all__ = ["TFClient"]
