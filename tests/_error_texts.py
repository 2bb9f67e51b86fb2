"""Error texts users match: each case below, run by this package or by dm-reverb 0.14 (the
wire-compatibility tests run it under both and compare), prints the kind of error and its
first sentence. Prints RESULTS {case: text} as JSON."""

import json
import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import reverb  # noqa: E402
from reverb import rate_limiters, selectors  # noqa: E402

RESULTS = {}
KINDS = (ValueError, TypeError, tf.errors.OpError, RuntimeError, Exception)
srv = reverb.Server(
    [
        reverb.Table.queue("q", 10),
        reverb.Table.queue("sig", 10, signature={"a": tf.TensorSpec([2], tf.float32)}),
    ]
)
addr = f"localhost:{srv.port}"
c = reverb.Client(addr)


def T(name, f):
    """Records what `f` raises: its kind (tf.errors by class) and first sentence."""
    try:
        f()
        RESULTS[name] = "OK"
        return
    except Exception as e:  # noqa: BLE001 - every error is a result here
        kind = next(k for k in KINDS if isinstance(e, k))
        kind = type(e).__name__ if kind is tf.errors.OpError else kind.__name__
        text = str(e).splitlines()[0] if str(e) else ""
    text = re.sub(r"^\{\{function_node [^}]*\}\} ", "", text)
    # Our dataset errors arise inside a tf.data function, which TensorFlow prefixes.
    text = re.sub(r"^Error in user-defined function passed to .*?Map: ", "", text)
    text = re.sub(r" \[Op:.*$", "", text).replace(addr, "ADDR")
    RESULTS[name] = f"{kind}: {text.split('. ')[0]}"


dt = (tf.float32,)
sh = (tf.TensorShape([]),)
one = dict(max_in_flight_samples_per_worker=1, rate_limiter_timeout_ms=1000)
for cls in ["TrajectoryDataset", "TimestepDataset"]:
    C = getattr(reverb, cls)
    for kw in [
        dict(max_in_flight_samples_per_worker=0),
        dict(num_workers_per_iterator=0),
        dict(max_samples_per_stream=0),
        dict(rate_limiter_timeout_ms=-2),
        dict(max_samples=0),
    ]:
        args = dict(max_in_flight_samples_per_worker=1)
        args.update(kw)
        T(f"{cls} {list(kw)[0]}", lambda C=C, args=args: C(addr, "q", dt, sh, **args))
    T(
        f"{cls}.from_table_signature unknown",
        lambda C=C: C.from_table_signature(addr, "nope", max_in_flight_samples_per_worker=1),
    )
    T(
        f"{cls}.from_table_signature nosig",
        lambda C=C: C.from_table_signature(addr, "q", max_in_flight_samples_per_worker=1),
    )
    T(
        f"{cls} dtype incompatible with the signature",
        lambda C=C: next(iter(C(addr, "sig", (tf.int64,), (tf.TensorShape([3, 3]),), **one))),
    )
    T(
        f"{cls} more dtypes than the signature",
        lambda C=C: next(iter(C(addr, "sig", dt * 2, (tf.TensorShape([2]),) * 2, **one))),
    )
    T(
        f"{cls} shape received without a signature",
        lambda C=C: (
            c.insert([np.zeros((2, 2), np.float32)], {"q": 1.0}),
            next(iter(C(addr, "q", dt, (tf.TensorShape([3]),), **one))),
        ),
    )
T("trajectory_writer(0)", lambda: c.trajectory_writer(0))
T("writer(0)", lambda: c.writer(0))
T("writer(5, chunk_length=6)", lambda: c.writer(5, chunk_length=6))
T("writer(1, max_in_flight_items=0)", lambda: c.writer(1, max_in_flight_items=0))
T("structured_writer([])", lambda: c.structured_writer([]))


def fl():
    w = c.trajectory_writer(1)
    w.flush(block_until_num_items=-1)


T("flush(-1)", fl)


def conf():
    w = c.trajectory_writer(2)
    w.append({"x": np.zeros(1)})
    w.configure(("x",), num_keep_alive_refs=2, max_chunk_length=3)


T("configure(max_chunk_length=3)", conf)


def conf_refs(n):
    w = c.trajectory_writer(2)
    w.append({"x": np.zeros(1)})
    w.configure(("x",), num_keep_alive_refs=n, max_chunk_length=None)


T("configure(num_keep_alive_refs=0)", lambda: conf_refs(0))
T("configure(num_keep_alive_refs=-1)", lambda: conf_refs(-1))


def wrong_dtype():
    w = c.trajectory_writer(2)
    w.append({"x": np.zeros(1)})
    w.append({"x": np.zeros(1, np.int32)})


T("append wrong dtype", wrong_dtype)


def wrong_shape():
    w = c.trajectory_writer(2)
    w.append({"x": np.zeros(1)})
    w.append({"x": np.zeros(2)})


T("append wrong shape", wrong_shape)


def twice():
    w = c.trajectory_writer(2)
    w.append({"x": np.zeros(1)}, partial_step=True)
    w.append({"x": np.zeros(1)})


T("append twice", twice)


def item(value: np.ndarray, table: str, trajectory) -> None:
    """An item of `table` from `trajectory(history)` after one step holding `value`."""
    w = c.trajectory_writer(2)
    w.append({"x": value})
    w.create_item(table, 1.0, trajectory(w.history))


T(
    "create_item sig mismatch",
    lambda: item(np.zeros(3, np.float32), "sig", lambda h: {"a": h["x"][-1]}),
)
T(
    "create_item sig dtype",
    lambda: item(np.zeros(2, np.float64), "sig", lambda h: {"a": h["x"][-1]}),
)
T(
    "create_item sig structure",
    lambda: item(np.zeros(2, np.float32), "sig", lambda h: {"b": h["x"][-1]}),
)
T(
    "create_item not column",
    lambda: item(np.zeros(2, np.float32), "q", lambda h: {"b": np.zeros(2)}),
)


T("create_item None", lambda: item(np.zeros(2, np.float32), "q", lambda h: {"b": None}))
T("insert sig mismatch", lambda: c.insert({"a": np.zeros(3, np.float32)}, {"sig": 1.0}))
T("insert unknown table", lambda: c.insert([np.zeros(3)], {"nope": 1.0}))
T("sample unknown table", lambda: list(c.sample("nope", 1)))
T("sample num_samples=0", lambda: list(c.sample("q", 0)))
T("mutate unknown", lambda: c.mutate_priorities("nope", updates={1: 1.0}))
T("reset unknown", lambda: c.reset("nope"))
T("MinSize(0)", lambda: rate_limiters.MinSize(0))
T("SampleToInsertRatio(-1,1,1)", lambda: rate_limiters.SampleToInsertRatio(-1, 1, 1))
T("SampleToInsertRatio(1,0,1)", lambda: rate_limiters.SampleToInsertRatio(1, 0, 1))
T("SampleToInsertRatio(1,1,0)", lambda: rate_limiters.SampleToInsertRatio(1, 1, 0))
T("Queue(0)", lambda: rate_limiters.Queue(0))
T("Stack(0)", lambda: rate_limiters.Stack(0))
T("Prioritized(-1)", lambda: selectors.Prioritized(-1.0))
T(
    "Table max_size 0",
    lambda: reverb.Table("x", selectors.Uniform(), selectors.Fifo(), 0, rate_limiters.MinSize(1)),
)
T(
    "Table max_times_sampled -1",
    lambda: reverb.Table(
        "x",
        selectors.Uniform(),
        selectors.Fifo(),
        10,
        rate_limiters.MinSize(1),
        max_times_sampled=-1,
    ),
)
T(
    "Server dup tables",
    lambda: reverb.Server([reverb.Table.queue("a", 1), reverb.Table.queue("a", 1)]),
)
T("Server no tables", lambda: reverb.Server([]))
T(
    "TFClient insert bad tables",
    lambda: reverb.TFClient(addr).insert(
        [tf.constant(1.0)], tf.constant("q"), tf.constant([1.0], tf.float64)
    ),
)
T(
    "TFClient insert bad prio",
    lambda: reverb.TFClient(addr).insert(
        [tf.constant(1.0)], tf.constant(["q"]), tf.constant([1.0], tf.float32)
    ),
)
T(
    "TFClient insert sig",
    lambda: reverb.TFClient(addr).insert(
        [tf.constant([1.0])], tf.constant(["sig"]), tf.constant([1.0], tf.float64)
    ),
)
T(
    "TFClient update prio shape",
    lambda: reverb.TFClient(addr).update_priorities(
        "q", tf.constant([1, 2], tf.uint64), tf.constant([1.0], tf.float64)
    ),
)
T(
    "legacy create_item 0",
    lambda: (lambda w: (w.append([np.zeros(1)]), w.create_item("q", 0, 1.0)))(c.writer(2)),
)
T(
    "legacy create_item too many",
    lambda: (lambda w: (w.append([np.zeros(1)]), w.create_item("q", 3, 1.0)))(c.writer(2)),
)
T("legacy create_item before append", lambda: c.writer(2).create_item("q", 1, 1.0))


def closed_writer():
    w = c.trajectory_writer(2)
    w.append({"x": np.float32(1)})
    w.close()
    return w


T("trajectory_writer flush after close", lambda: closed_writer().flush())
T("trajectory_writer append after close", lambda: closed_writer().append({"x": np.float32(2)}))
T("trajectory_writer end_episode after close", lambda: closed_writer().end_episode())
T("trajectory_writer close twice", lambda: closed_writer().close())
print("RESULTS" + json.dumps(RESULTS))
os._exit(0)
