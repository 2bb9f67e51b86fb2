"""The `reverb` command: look into a replay.

    reverb inspect PATH_OR_ADDRESS [--table T] [--bins N] [--plot out.png]
    reverb export PATH --to DIR [--table T] [--rows auto|items|steps] [--format parquet|rlds]
    reverb import FILE.parquet --to HOST:PORT [--table T]
    reverb import DATASET --episodes --to HOST:PORT --table T [--column NAME=COLUMN ...]
        [--episode-column C] [--step-column C] [--sequence-length N] [--period P]
    reverb top HOST:PORT [--metrics-port P] [--interval S] [--once]

`inspect` describes a checkpoint (a directory `Client.checkpoint()` returned, its file, or a
checkpointer's root) read without a server: each table's settings, counters and signature,
its items' priorities and times sampled (statistics and histograms) and episodes. Given a
server's address (`host:port`) instead, it describes the live tables from `ServerInfo` (what
any Reverb server, dm-reverb's too, reports: sizes, episodes, rate limiter, signature).
`--plot` draws the histograms into a PNG (needs matplotlib). `export` writes each table of a
checkpoint to `DIR/<table>.parquet` and `import` seeds a live table with such a file's items,
or, with `--episodes`, with the episodes of a dataset of step rows (a LeRobot v3 dataset's
root, say; see `reverb.parquet.load_episodes`). Not in the reference.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from typing import Any, Dict, List, Optional, Sequence, TextIO

import numpy as np

BAR = 40


def _kind(options: Any) -> str:
    """A selector's name from its KeyDistributionOptions."""
    from reverb import item_selectors
    from reverb.server_executable.server_from_proto import selector_from_proto

    try:
        selector = selector_from_proto(options)
    except (NotImplementedError, ValueError):
        return "?"
    if isinstance(selector, item_selectors.Prioritized):
        return f"Prioritized({selector.priority_exponent:g})"
    return type(selector).__name__


def _stats(name: str, values: np.ndarray, bins: int, out: TextIO) -> None:
    """One line of statistics and a text histogram of `values`."""
    if values.size == 0:
        print(f"  {name}: none", file=out)
        return
    print(
        f"  {name}: min {values.min():.6g}  mean {values.mean():.6g}  "
        f"max {values.max():.6g}  std {values.std():.6g}",
        file=out,
    )
    counts, edges = np.histogram(values, bins=bins)
    top = max(int(counts.max()), 1)
    for count, low, high in zip(counts, edges[:-1], edges[1:]):
        bar = "#" * math.ceil(BAR * int(count) / top) if count else ""
        print(f"    [{low:>10.4g}, {high:>10.4g})  {int(count):>9}  {bar}".rstrip(), file=out)


def _table_lines(name: str, size: int, table: Any, limiter: Any, counts: str) -> List[str]:
    """The lines both sources share: size, selectors, rate limiter (with `counts`)."""
    return [
        f"\ntable {name!r}: {size} items of at most {table.max_size}",
        f"  sampler {_kind(table.sampler_options)}, remover {_kind(table.remover_options)}, "
        f"max_times_sampled {table.max_times_sampled}",
        f"  rate limiter: samples_per_insert {limiter.samples_per_insert:g}, "
        f"min_size_to_sample {limiter.min_size_to_sample}, diff "
        f"[{limiter.min_diff:g}, {limiter.max_diff:g}]; {counts}",
    ]


def _check_tables(wanted: Optional[Sequence[str]], present: Dict[str, Any]) -> None:
    unknown = sorted(set(wanted or ()) - set(present))
    if unknown:
        raise KeyError(f"no table {unknown[0]!r} (there are {sorted(present)})")


def _signature_lines(signature: Any) -> List[str]:
    if signature is None:
        return ["  signature: none"]
    import tensorflow as tf  # a decoded signature means TensorFlow is there

    flat = tf.nest.flatten_with_joined_string_paths(signature)
    return ["  signature:"] + [
        f"    {path or '.'}: {spec.dtype.name}{spec.shape.as_list()}" for path, spec in flat
    ]


def inspect_checkpoint(
    path: str, tables: Optional[Sequence[str]], bins: int, out: TextIO
) -> Dict[str, Dict[str, np.ndarray]]:
    """Prints what the checkpoint at `path` holds; returns each table's priorities and times
    sampled (for plots)."""
    from reverb import checkpoint

    found: Dict[str, Dict[str, np.ndarray]] = {}
    with checkpoint.open(path) as ckpt:
        print(f"checkpoint {ckpt.path}", file=out)
        _check_tables(tables, ckpt.tables)
        for name, table in ckpt.tables.items():
            if tables and name not in tables:
                continue
            limiter = table.rate_limiter
            counts = (
                f"inserts {limiter.insert_count}, samples {limiter.sample_count}, "
                f"deletes {limiter.delete_count}"
            )
            lines = _table_lines(name, table.num_items, table, limiter, counts)
            for line in lines + _signature_lines(table.signature):
                print(line, file=out)
            priorities, sampled, episodes = [], [], set()
            for item in ckpt.items(name, data=False):
                priorities.append(item.priority)
                sampled.append(item.times_sampled)
                episodes.add(item.episode_id)
            print(
                f"  episodes: {len(episodes)} with items here, "
                f"{table.num_deleted_episodes} deleted; unique samples "
                f"{table.num_unique_samples}",
                file=out,
            )
            found[name] = {
                "priority": np.asarray(priorities, np.float64),
                "times sampled": np.asarray(sampled, np.int64),
            }
            for what, values in found[name].items():
                _stats(what, values, bins, out)
    return found


def inspect_server(
    address: str, tables: Optional[Sequence[str]], auth_token: Optional[str], out: TextIO
) -> None:
    """Prints the live tables of the server at `address` (from ServerInfo)."""
    import reverb

    kwargs = {"auth_token": auth_token} if auth_token else {}
    info = reverb.Client(address, **kwargs).server_info(timeout=10)
    print(f"server {address}", file=out)
    _check_tables(tables, info)
    for name, table in info.items():
        if tables and name not in tables:
            continue
        limiter = table.rate_limiter_info
        completed = (limiter.insert_stats.completed, limiter.sample_stats.completed)
        counts = "inserts {}, samples {}".format(*completed)
        for line in _table_lines(name, table.current_size, table, limiter, counts):
            print(line, file=out)
        print(
            f"  episodes: {table.num_episodes}, {table.num_deleted_episodes} deleted; unique "
            f"samples {table.num_unique_samples}",
            file=out,
        )
        for line in _signature_lines(table.signature):
            print(line, file=out)


def plot(found: Dict[str, Dict[str, np.ndarray]], bins: int, path: str) -> None:
    """Histograms of priorities and times sampled, a row per table with items, into a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib (pip install matplotlib)") from None
    found = {name: series for name, series in found.items() if series["priority"].size}
    if not found:
        raise SystemExit("--plot: no table has items")
    rows = len(found)
    fig, axes = plt.subplots(rows, 2, figsize=(10, 3 * rows), squeeze=False)
    for row, (name, series) in enumerate(found.items()):
        for col, (what, values) in enumerate(series.items()):
            ax = axes[row][col]
            edges: Any = bins
            if values.dtype.kind in "iu" and values.max() - values.min() <= 100:
                edges = np.arange(values.min(), values.max() + 2) - 0.5  # one bar per count
            ax.hist(values, bins=edges)
            ax.set_title(f"{name}: {what} ({values.size} items)")
            ax.set_xlabel(what)
            ax.set_ylabel("items")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="reverb", description="Look into a replay.")
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser(
        "inspect", help="describe a checkpoint (a path) or a live server (host:port)"
    )
    inspect.add_argument("target", help="checkpoint directory, file or root; or host:port")
    inspect.add_argument("--table", action="append", help="only this table (repeatable)")
    inspect.add_argument("--bins", type=int, default=10, help="histogram bins (default 10)")
    inspect.add_argument("--plot", metavar="PNG", help="draw the histograms (matplotlib)")
    inspect.add_argument("--auth-token", help="for a server that asks for one")
    export = commands.add_parser("export", help="write a checkpoint's tables to Parquet files")
    export.add_argument("source", help="checkpoint directory, file or root")
    export.add_argument("--to", required=True, metavar="DIR", help="where the files go")
    export.add_argument("--table", action="append", help="only this table (repeatable)")
    export.add_argument(
        "--format",
        default="parquet",
        choices=["parquet", "rlds"],
        help="parquet (default; pyarrow) or rlds (episodes as a TFDS dataset; TensorFlow Datasets)",
    )
    export.add_argument("--batch-rows", type=int, default=1024, help="rows per row group")
    export.add_argument(
        "--rows",
        default="auto",
        choices=["auto", "items", "steps"],
        help="a row per item, or per step of the episodes reassembled from the items; auto "
        "(default): steps where the items allow it",
    )
    load = commands.add_parser(
        "import", help="seed a live table with the items of a Parquet file (reverb export's)"
    )
    load.add_argument("file", help="a Parquet file of item rows (with --episodes: a dataset)")
    load.add_argument("--to", required=True, metavar="HOST:PORT", help="the server")
    load.add_argument("--table", help="the table (default: the one the file names)")
    load.add_argument("--auth-token", help="for a server that asks for one")
    load.add_argument(
        "--episodes",
        action="store_true",
        help="the rows are steps of episodes (a LeRobot v3 dataset's root, a directory of "
        "Parquet files, or one): written episode by episode",
    )
    load.add_argument(
        "--column",
        action="append",
        metavar="NAME=COLUMN",
        help="with --episodes: the step field NAME from the file's COLUMN (repeatable; "
        "default: every column by its own name)",
    )
    load.add_argument(
        "--episode-column", help="default: episode_index (LeRobot), episode_id (ours)"
    )
    load.add_argument("--step-column", help="default: frame_index (LeRobot), step (ours)")
    load.add_argument("--sequence-length", type=int, default=1, help="steps per item (default 1)")
    load.add_argument("--period", type=int, default=1, help="steps between items (default 1)")
    top = commands.add_parser("top", help="a live view of a server's tables (needs rich)")
    top.add_argument("address", help="host:port of the server")
    top.add_argument("--metrics-port", type=int, help="the server's metrics port (ours)")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.add_argument("--auth-token", help="for a server that asks for one")
    top.add_argument("--tls-ca", help="PEM file of the authority a TLS server's cert is from")
    args = parser.parse_args(argv)
    if args.command == "top":
        return _top(args)
    if args.command == "export":
        return _export(args)
    if args.command == "import":
        return _import(args)
    if args.bins < 1:
        parser.error("--bins must be at least 1")
    if not os.path.exists(args.target) and not re.fullmatch(r"[\w.\-\[\]:]+:\d+", args.target):
        print(
            f"reverb inspect: {args.target}: no such checkpoint, nor a host:port", file=sys.stderr
        )
        return 1
    try:
        if os.path.exists(args.target):
            found = inspect_checkpoint(args.target, args.table, args.bins, sys.stdout)
            if args.plot:
                plot(found, args.bins, args.plot)
                print(f"\nplot: {args.plot}")
        else:
            if args.plot:
                parser.error("--plot needs a checkpoint (a live server gives no priorities)")
            inspect_server(args.target, args.table, args.auth_token, sys.stdout)
    except (ValueError, KeyError) as e:
        print(f"reverb inspect: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a server that is not there, say
        name = type(e).__name__
        print(f"reverb inspect: {args.target}: {name}: {e}", file=sys.stderr)
        return 1
    return 0


def _export(args: argparse.Namespace) -> int:
    from reverb import parquet

    try:
        if args.format == "rlds":
            if args.rows == "items":
                print("reverb export: RLDS holds episodes, not items", file=sys.stderr)
                return 1
            from reverb import rlds

            written = rlds.export(args.source, args.to, args.table)
        else:
            written = parquet.export(
                args.source, args.to, args.table, batch_rows=args.batch_rows, rows=args.rows
            )
    except (ValueError, KeyError, ImportError) as e:
        print(f"reverb export: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # what Arrow cannot write, a file in the way, ...
        print(f"reverb export: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    for table, out in written.items():
        if out.rows == "episodes" and out.why_items:
            print(f"{table}: nothing written ({out.why_items})")
        elif out.rows == "episodes":
            print(f"{table}: {out.path}: {out.count} episodes (RLDS)")
        elif out.rows == "steps":
            print(f"{table}: {out.path}: {out.count} steps (episodes reassembled)")
        elif out.why_items:
            print(f"{table}: {out.path}: {out.count} items (not reassembled: {out.why_items})")
        else:
            print(f"{table}: {out.path}: {out.count} items")
    return 0


def _import(args: argparse.Namespace) -> int:
    import reverb
    from reverb import parquet

    kwargs = {"auth_token": args.auth_token} if args.auth_token else {}
    columns = None
    if args.column:
        pairs = [c.partition("=") for c in args.column]
        bad = [c for c, (name, eq, column) in zip(args.column, pairs) if not (name and column)]
        if bad:
            print(f"reverb import: --column {bad[0]!r} is not NAME=COLUMN", file=sys.stderr)
            return 1
        columns = {name: column for name, _, column in pairs}
    try:
        steps = os.path.isfile(args.file) and parquet.holds_steps(args.file)
        episode_options = [
            (args.column, "--column"),
            (args.sequence_length != 1, "--sequence-length"),
            (args.period != 1, "--period"),
            (args.episode_column, "--episode-column"),
            (args.step_column, "--step-column"),
        ]
        given = [flag for value, flag in episode_options if value]
        if given and not (args.episodes or steps):
            print(f"reverb import: {given[0]} needs --episodes", file=sys.stderr)
            return 1
        client = reverb.Client(args.to, **kwargs)
        if args.episodes or steps:
            loaded = parquet.load_episodes(
                client,
                args.file,
                args.table,
                columns=columns,
                episode_column=args.episode_column,
                step_column=args.step_column,
                sequence_length=args.sequence_length,
                period=args.period,
                timeout=60,
            )
            print(f"{loaded.episodes} episodes, {loaded.steps} steps into {args.to}")
            return 0
        count = parquet.load(client, args.file, args.table, timeout=60)
    except Exception as e:  # bad file, unknown table, refused items, no server
        print(f"reverb import: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(f"{count} items into {args.to}")
    return 0


def _top(args: argparse.Namespace) -> int:
    try:
        import rich  # noqa: F401
    except ImportError:
        print("reverb top needs rich: pip install 'dm-reverb[top]'", file=sys.stderr)
        return 1
    from reverb import top

    try:
        view = top.Top(
            args.address,
            metrics_port=args.metrics_port,
            auth_token=args.auth_token,
            tls_ca=args.tls_ca,
        )
        top.run(view, max(args.interval, 0.1), args.once)
    except Exception as e:  # no server there, a refused token, ...
        print(f"reverb top: {args.address}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
