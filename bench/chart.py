"""Draws the ratio chart (ours / reference) of one run: the first table in the file, which is
`bench/run.py --markdown`'s output, or the newest run at the top of bench/RESULTS.md (newest
first). Rows of other runs are never mixed in. With a third argument, the first table after
the first line containing it (e.g. "### Full side-by-side run of 1141a80").

python bench/chart.py bench/RESULTS.md bench/ratios.png [AFTER]   (needs matplotlib)

With `--peers`, the peers chart instead: the first table (after AFTER) of `bench/peers.py`'s
output as the README shows it (a column per system, then ratio columns "ours / peer"), as
items/s per case and system on a log scale.

python bench/chart.py --peers README.md bench/peers.png "### Against in-process"
"""

from __future__ import annotations

import re
import sys


def _lines_after(source: str, after: str) -> list:
    """The lines of `source` after the first one containing `after` (all, without it)."""
    with open(source) as f:
        lines = f.read().splitlines()
    if after:
        starts = [i for i, line in enumerate(lines) if after in line]
        if not starts:
            raise SystemExit(f"no line of {source} contains {after!r}")
        lines = lines[starts[0] + 1 :]
    return lines


def read_rows(source: str, after: str = "") -> list:
    """(label, ratio) of every row of the first table in `source` with a ratio column (the
    first after the first line containing `after`, if given)."""
    rows: list = []
    for line in _lines_after(source, after):
        match = re.match(r"\| (\w+) \| ([\w ]+) \| .* \| ([\d.]+)x \|$", line.strip())
        if match:
            server = "same proc." if match.group(2) == "same process" else "other proc."
            rows.append((f"{match.group(1)} ({server})", float(match.group(3))))
        elif rows:
            break  # the end of the first table
    return rows


def read_peers(source: str, after: str = "") -> tuple:
    """(systems, [(case, [items/s or None per system])]) of the first peers table in
    `source` (after the first line containing `after`, if given): the columns before the
    first ratio column ("a / b") are systems."""
    systems: list = []
    rows: list = []
    for line in _lines_after(source, after):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|"):
            if rows:
                break
            continue
        if not systems:
            systems = [c for c in cells[1:] if " / " not in c]
            continue
        if set(cells[0]) <= set("-"):
            continue
        values = []
        for cell in cells[1 : 1 + len(systems)]:
            number = re.match(r"[\d,.]+", cell)
            values.append(float(number.group(0).replace(",", "")) if number else None)
        rows.append((cells[0], values))
    if not rows:
        raise SystemExit(f"no peers table in {source}")
    return systems, rows


def draw_peers(source: str, target: str, after: str) -> None:
    """Grouped bars: items/s of every system on every case (log scale)."""
    systems, rows = read_peers(source, after)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    height = 0.8 / len(systems)
    fig, ax = plt.subplots(figsize=(9, 2.2 + 0.75 * len(rows)))
    colors = plt.get_cmap("tab10").colors
    for j, system in enumerate(systems):
        ys = [i + (j - (len(systems) - 1) / 2) * height for i in range(len(rows))]
        xs = [values[j] or 0 for _, values in rows]
        ax.barh(ys, xs, height=height, label=system, color=colors[j % len(colors)])
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([_wrap(case) for case, _ in rows], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(left=1e4)
    ax.set_xlabel("items (steps) per second, log scale; a missing bar: no such buffer")
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=4)
    ax.set_title("reverb (this project) and the replay buffers researchers also use")
    fig.tight_layout()
    fig.savefig(target, dpi=110)


def _wrap(text: str, width: int = 34) -> str:
    """`text` broken into lines of at most about `width` characters."""
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "\n".join(lines + [line])


def main() -> None:
    if sys.argv[1] == "--peers":
        draw_peers(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "")
        return
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
