"""`reverb top ADDRESS`: a live view of a server's tables, refreshed every second.

Per table: items held against the bound, inserts and samples per second (over the last
refresh), samples per insert so far against the rate limiter's target, episodes; with the
server's metrics endpoint (`--metrics-port`, ours only) also the calls waiting on the rate
limiter and why it blocks them, and for the server the open streams and chunk bytes held.
Works against any Reverb server (dm-reverb's too) with what `ServerInfo` gives. Needs rich
(`pip install 'dm-reverb[top]'`). Not in the reference.
"""

from __future__ import annotations

import dataclasses
import re
import time
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

import reverb

_SAMPLE = re.compile(r"^(\w+)(?:\{([^}]*)\})?\s+(\S+)$")


def parse_metrics(text: str) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    """Prometheus text format: {(name, sorted labels): value}."""
    out = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if not match or line.startswith("#"):
            continue
        name, labels, value = match.groups()
        pairs = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', labels or "")))
        try:
            out[(name, pairs)] = float(value)
        except ValueError:
            continue
    return out


@dataclasses.dataclass
class Snapshot:
    """What one refresh read: the tables' infos and, when asked, the metrics."""

    at: float
    tables: Dict[str, Any]
    metrics: Optional[Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]]


class Top:
    """Reads a server's state and renders it (see `frame`)."""

    def __init__(
        self,
        address: str,
        *,
        metrics_port: Optional[int] = None,
        auth_token: Optional[str] = None,
        tls_ca: Optional[str] = None,
        timeout: float = 5.0,
    ) -> None:
        kwargs: Dict[str, Any] = {}
        if auth_token:
            kwargs["auth_token"] = auth_token
        if tls_ca:
            kwargs["tls_ca"] = tls_ca
        self.address = address
        self._client = reverb.Client(address, **kwargs)
        host = address.rsplit(":", 1)[0]
        self._metrics_url = None
        if metrics_port:
            self._metrics_url = f"http://{host}:{metrics_port}/metrics"
        self._timeout = timeout
        self._previous: Optional[Snapshot] = None

    def read(self) -> Snapshot:
        tables = self._client.server_info(timeout=self._timeout)
        metrics = None
        if self._metrics_url:
            with urllib.request.urlopen(self._metrics_url, timeout=self._timeout) as reply:
                metrics = parse_metrics(reply.read().decode())
        return Snapshot(time.monotonic(), tables, metrics)

    def rows(self, now: Snapshot) -> List[List[str]]:
        """One row per table: the columns of `HEADER`."""
        before = self._previous
        rows = []
        for name, info in sorted(now.tables.items()):
            limiter = info.rate_limiter_info
            inserts = limiter.insert_stats.completed
            samples = limiter.sample_stats.completed
            insert_rate = sample_rate = "-"
            if before is not None and name in before.tables:
                dt = max(now.at - before.at, 1e-6)
                old = before.tables[name].rate_limiter_info
                insert_rate = f"{(inserts - old.insert_stats.completed) / dt:,.0f}"
                sample_rate = f"{(samples - old.sample_stats.completed) / dt:,.0f}"
            ratio = f"{samples / inserts:.2f}" if inserts else "-"
            waiting = blocked = "-"
            if now.metrics is not None:
                label = (("table", name),)
                waits = [
                    now.metrics.get((f"reverb_table_{call}s_waiting", label), 0)
                    for call in ("insert", "sample")
                ]
                waiting = f"{waits[0]:.0f} / {waits[1]:.0f}"
                reasons = [
                    f"{dict(labels)['call']}: {dict(labels)['reason']}"
                    for (metric, labels), value in now.metrics.items()
                    if metric == "reverb_table_blocked"
                    and dict(labels).get("table") == name
                    and value > 0
                ]
                blocked = ", ".join(sorted(reasons)) or "no"
            rows.append(
                [
                    name,
                    f"{info.current_size:,}/{info.max_size:,}",
                    insert_rate,
                    sample_rate,
                    f"{ratio} ({limiter.samples_per_insert:g})",
                    f"{info.num_episodes:,}",
                    waiting,
                    blocked,
                ]
            )
        self._previous = now
        return rows

    def footer(self, now: Snapshot) -> str:
        if now.metrics is None:
            return "(no metrics endpoint: --metrics-port adds waits, blocks, streams, bytes)"
        streams = {
            dict(labels).get("kind", "?"): value
            for (metric, labels), value in now.metrics.items()
            if metric == "reverb_streams"
        }
        chunks = now.metrics.get(("reverb_chunks", ()), 0)
        chunk_bytes = now.metrics.get(("reverb_chunk_bytes", ()), 0)
        open_streams = ", ".join(f"{k} {v:.0f}" for k, v in sorted(streams.items())) or "none"
        return f"streams: {open_streams}   chunks: {chunks:,.0f} ({chunk_bytes / 1e6:,.1f} MB)"

    def frame(self) -> Any:
        """A rich renderable of the server's state now."""
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        now = self.read()
        table = Table(title=f"reverb top  {self.address}  {time.strftime('%H:%M:%S')}")
        for column in HEADER:
            table.add_column(column, justify="left" if column in ("table", "blocked") else "right")
        for row in self.rows(now):
            table.add_row(*row)
        return Group(table, Text(self.footer(now)))


HEADER = [
    "table",
    "size/max",
    "ins/s",
    "smp/s",
    "smp/ins (target)",
    "episodes",
    "waiting ins/smp",
    "blocked",
]


def run(top: Top, interval: float, once: bool) -> None:
    """Refreshes every `interval` seconds until interrupted (or one frame with `once`)."""
    from rich.console import Console
    from rich.live import Live

    console = Console()
    if not console.is_terminal:  # (a pipe or a file: rich would assume 80 columns)
        console = Console(width=160)
    if once:
        top.rows(top.read())  # a first reading: the rates are over the interval after it
        time.sleep(interval)
        console.print(top.frame())
        return
    with Live(top.frame(), console=console, refresh_per_second=4, screen=False) as live:
        try:
            while True:
                time.sleep(interval)
                live.update(top.frame())
        except KeyboardInterrupt:
            pass


__all__ = ["Top", "parse_metrics", "run"]
