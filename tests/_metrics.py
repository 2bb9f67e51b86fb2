"""The Prometheus endpoint of a server, read as Prometheus would, for tests."""

from __future__ import annotations

import re
import urllib.request

T = 10.0


def scrape(port: int) -> dict:
    """Every sample of the endpoint at `port`, by name with labels; checks the content type
    and that every metric has its HELP and TYPE."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=T) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        name, value = line.rsplit(" ", 1)
        samples[name] = float(value)
    # Every metric has its HELP and TYPE.
    for name in {re.sub(r"\{.*", "", n) for n in samples}:
        assert f"# TYPE {name} " in text and f"# HELP {name} " in text, name
    return samples


def waiting(port: int, table: str, call: str) -> float:
    """How many `call`s ("insert" or "sample") wait on `table`'s rate limiter now."""
    return scrape(port)[f'reverb_table_{call}s_waiting{{table="{table}"}}']


def waited(port: int, table: str, call: str) -> float:
    """The total time ended waits of `call`s ("insert" or "sample") spent on `table`'s rate
    limiter: above 0 once a call that waited there ended (returned, timed out, cancelled)."""
    return scrape(port)[f'reverb_table_wait_seconds_total{{table="{table}",call="{call}"}}']
