"""Draws the ratio chart (ours / reference) of one run: the first table in the file, which is
`bench/run.py --markdown`'s output, or the newest run at the top of bench/RESULTS.md (newest
first). Rows of other runs are never mixed in. With a third argument, the first table after
the first line containing it (e.g. "### Full side-by-side run of 1141a80").

python bench/chart.py bench/RESULTS.md bench/ratios.png [AFTER]   (needs matplotlib)
"""

from __future__ import annotations

import re
import sys


def read_rows(source: str, after: str = "") -> list:
    """(label, ratio) of every row of the first table in `source` with a ratio column (the
    first after the first line containing `after`, if given)."""
    rows: list = []
    with open(source) as f:
        lines = f.read().splitlines()
    if after:
        starts = [i for i, line in enumerate(lines) if after in line]
        if not starts:
            raise SystemExit(f"no line of {source} contains {after!r}")
        lines = lines[starts[0] + 1 :]
    for line in lines:
        match = re.match(r"\| (\w+) \| ([\w ]+) \| .* \| ([\d.]+)x \|$", line.strip())
        if match:
            server = "same proc." if match.group(2) == "same process" else "other proc."
            rows.append((f"{match.group(1)} ({server})", float(match.group(3))))
        elif rows:
            break  # the end of the first table
    return rows


def main() -> None:
    source, target = sys.argv[1], sys.argv[2]
    rows = read_rows(source, sys.argv[3] if len(sys.argv) > 3 else "")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.32 * len(rows)))
    labels = [r[0] for r in rows]
    ratios = [r[1] for r in rows]
    bars = ax.barh(labels, ratios, color="#3b7dd8")
    ax.axvline(1.0, color="black", linewidth=1)
    ax.bar_label(bars, labels=[f"{r:.1f}x" for r in ratios], padding=3)
    ax.set_xlabel(
        "ours relative to dm-reverb 0.14.0 (>1 = better: faster, or less latency / memory)"
    )
    if max(ratios) > 20:
        # A log scale keeps ratios near 1 readable next to a very large one.
        ax.set_xscale("log")
        ax.set_xlim(min(0.5, min(ratios) * 0.8), max(ratios) * 2)
    else:
        ax.set_xlim(0, max(ratios) * 1.2)
    ax.invert_yaxis()
    ax.set_title("reverb (this project) vs dm-reverb 0.14.0, same machine, same run")
    fig.tight_layout()
    fig.savefig(target, dpi=110)


if __name__ == "__main__":
    main()
