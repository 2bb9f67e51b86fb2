"""Run by dm-reverb 0.14 (tests/test_dm_checkpoint.py): fills tables through its writers, samples
and mutates some items, writes a checkpoint under argv[1] and prints (as RESULTS JSON) what each
table held: its items in insertion order (key where sampling revealed it, priority, times
sampled, data) and its server info."""

import collections
import json
import sys

import numpy as np

import reverb


def make_tables(signature=None) -> list:
    """The tables the checkpoint holds (`signature`: the prioritized table's), as dm-reverb
    makes them here and as tests/test_dm_checkpoint.py configures ours to match."""
    return [
        # Items of two steps, sharing chunks with each other and with the other tables.
        reverb.Table(
            "prio",
            reverb.selectors.Prioritized(0.8),
            reverb.selectors.Fifo(),
            100,
            reverb.rate_limiters.MinSize(1),
            signature=signature,
        ),
        reverb.Table(
            "uniform",
            reverb.selectors.Uniform(),
            reverb.selectors.Fifo(),
            100,
            reverb.rate_limiters.SampleToInsertRatio(2.0, 1, 1000.0),
            max_times_sampled=50,
        ),
        # Deletes the oldest once full: holds the last 3 of 6.
        reverb.Table(
            "fifo",
            reverb.selectors.Fifo(),
            reverb.selectors.Fifo(),
            3,
            reverb.rate_limiters.MinSize(1),
        ),
        reverb.Table.queue("queue", 10),
    ]


def main() -> None:
    import tensorflow as tf

    root = sys.argv[1]
    sig = {"obs": tf.TensorSpec([2, 3], tf.float32), "step": tf.TensorSpec([], tf.int64)}
    tables = make_tables(sig)
    checkpointer = reverb.platform.checkpointers_lib.DefaultCheckpointer(path=root)
    server = reverb.Server(tables, checkpointer=checkpointer)
    client = reverb.Client(f"localhost:{server.port}")

    order = collections.defaultdict(list)  # table -> [(priority, data)] in insertion order
    for episode in range(2):
        with client.trajectory_writer(num_keep_alive_refs=2) as w:
            for t in range(4):
                step = 10 * episode + t
                w.append(
                    {
                        "obs": np.full([3], step, np.float32),
                        "step": np.int64(step),
                        "name": f"s{step}",
                    }
                )
                if t == 0:
                    continue
                prio = float(step % 7 + 1)
                w.create_item(
                    "prio", prio, {"obs": w.history["obs"][-2:], "step": w.history["step"][-1]}
                )
                order["prio"].append((prio, step, [[[step - 1] * 3, [step] * 3], step]))
                w.create_item("uniform", 0.5, [w.history["name"][-1], w.history["step"][-2:]])
                order["uniform"].append((0.5, step, [f"s{step}", [step - 1, step]]))
                w.create_item("fifo", 2.0, w.history["step"][-1])
                order["fifo"].append((2.0, step, step))
                w.create_item("queue", 1.0, [w.history["obs"][-1]])
                order["queue"].append((1.0, step, [[step] * 3]))
    client.insert([np.arange(4, dtype=np.int32)], {"queue": 3.0})
    order["queue"].append((3.0, None, [[[0, 1, 2, 3]]]))  # a column of one unsqueezed row
    order["fifo"] = order["fifo"][-3:]

    def step_of(table, data):
        """The step an item of `table` was made at (items are told apart by it)."""
        if table == "prio":  # obs, step: the signature's fields in sorted order
            return int(data[1])
        if table == "uniform":
            return int(data[1][-1])
        return int(data[0])

    keys, counts = {}, collections.Counter()
    for table, n in [("prio", 300), ("uniform", 150), ("fifo", 2)]:
        for sample in client.sample(table, n, emit_timesteps=False):
            keys[(table, step_of(table, sample.data))] = int(sample.info.key)
            counts[int(sample.info.key)] += 1
    # One priority changed after insertion.
    changed = next(k for (t, _), k in keys.items() if t == "prio")
    client.mutate_priorities("prio", updates={changed: 9.5})

    expected = {}
    for table, items in order.items():
        rows = []
        for priority, step, data in items:
            key = keys.get((table, step))
            if key == changed:
                priority = 9.5
            rows.append(
                {
                    "key": key,
                    "priority": priority,
                    "times_sampled": counts.get(key, 0),
                    "data": data,
                }
            )
        expected[table] = rows
    info = {}
    for name, t in client.server_info().items():
        info[name] = {
            "size": t.current_size,
            "episodes": t.num_episodes,
            "deleted_episodes": t.num_deleted_episodes,
            "inserts": t.rate_limiter_info.insert_stats.completed,
            "samples": t.rate_limiter_info.sample_stats.completed,
        }
    path = client.checkpoint()
    print("RESULTS" + json.dumps({"path": path, "items": expected, "info": info}))


if __name__ == "__main__":
    main()
