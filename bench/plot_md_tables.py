#!/usr/bin/env python3
"""Draws the tables of a benchmark's Markdown result (the `| call | fwd s | ... | fwd time / peer | ... |` tables that
`flashtile bench-variants` prints, as kept in bench/results/cpu_variants.md) as grouped bars: forward and backward
time relative to the table's peer call, one panel per table. Only the tables of the first fenced block are drawn (the main run).

    python3 bench/plot_md_tables.py bench/results/cpu_variants.md      (writes cpu_variants.png beside it)
"""
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def tables(text):
    """[(title, [(call, fwd time / peer, bwd time / peer)])] from the first ``` block."""
    block = text.split("```")[1]
    out, title = [], None
    for line in block.splitlines():
        if line and not line.startswith("|"):
            title = line.strip()
        elif line.startswith("| call"):
            head = [c.strip() for c in line.strip("|").split("|")]
            fwd, bwd = head.index("fwd time / peer"), head.index("bwd time / peer")
            out.append((title, [], fwd, bwd))
        elif line.startswith("|") and not line.startswith("|---") and out:
            cells = [c.strip() for c in line.strip("|").split("|")]
            out[-1][1].append((cells[0], float(cells[out[-1][2]]), float(cells[out[-1][3]])))
    return [(t, rows) for t, rows, _, _ in out]


def main(path):
    with open(path) as f:
        data = tables(f.read())
    fig, axes = plt.subplots(1, len(data), figsize=(6 * len(data), 5))
    for ax, (title, rows) in zip(axes, data):
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [r[1] for r in rows], 0.4, label="forward", color="C0")
        ax.bar([i + 0.2 for i in x], [r[2] for r in rows], 0.4, label="backward", color="C1")
        ax.set_xticks(list(x), [re.sub(r"\(.{40,}\)", "(...)", r[0]) for r in rows], rotation=30, ha="right",
                      fontsize=8)
        ax.set_title(title.split(":")[0], fontsize=10)
        ax.set_ylabel("time / the table's peer (lower is better)")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    fig.suptitle("FlashTile CPU variants (" + path.rsplit("/", 1)[-1] + ", first run)")
    fig.tight_layout()
    out = path.rsplit(".", 1)[0] + ".png"
    fig.savefig(out, dpi=100)
    print("wrote", out)


if __name__ == "__main__":
    main(sys.argv[1])
