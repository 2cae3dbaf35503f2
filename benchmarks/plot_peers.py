"""One plot per preset of every peer, from the JSON that ``bench.py --json`` writes.

    python benchmarks/plot_peers.py .bench/peers.json --out docs/images  # peers-<preset>.png

Each plot shows, for every peer and mode that ran, samples per CPU-second (the steadier
figure on a shared machine) and samples per second, as ratios to webdataset in-process on
the same preset in the same run: absolute figures from a loaded machine say little.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _report  # noqa: E402

ORDER = [p for p in _report.ALL_PEERS if p not in ("cat", "tarfile")]  # the loaders


def plot(preset: str, rows: dict, out: str, loadavg: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = rows.get(("webdataset", 0), {})
    keys = sorted(
        (k for k in rows if k[0] in ORDER and "samples_per_s" in rows[k]),
        key=lambda k: (ORDER.index(k[0]), k[1]),
    )
    failed = [k for k in rows if k[0] in ORDER and "samples_per_s" not in rows[k]]
    labels = [f"{p} ({_report.mode_name(w)})" for p, w in keys]
    cpu = [rows[k]["samples_per_cpu_s"] / base["samples_per_cpu_s"] for k in keys]
    wall = [rows[k]["samples_per_s"] / base["samples_per_s"] for k in keys]
    fig, ax = plt.subplots(figsize=(8, 0.36 * len(keys) + 1.6))
    ys = range(len(keys))
    ax.barh([y + 0.2 for y in ys], cpu, height=0.4, label="samples per CPU-second", color="#3b75af")
    ax.barh([y - 0.2 for y in ys], wall, height=0.4, label="samples per second", color="#ef8636")
    for y in ys:
        ax.text(cpu[y], y + 0.2, f" {cpu[y]:.2f}x", va="center", fontsize=7)
    ax.set_yticks(list(ys))
    ax.set_yticklabels(labels, fontsize=8)
    for tick, k in zip(ax.get_yticklabels(), keys, strict=True):
        if k[0].startswith("shardpipes"):
            tick.set_fontweight("bold")
    ax.invert_yaxis()
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("ratio to webdataset in-process, same run (higher is faster)")
    note = (
        f"; failed: {', '.join(f'{p} ({_report.mode_name(w)})' for p, w in failed)}"
        if failed
        else ""
    )
    ax.set_title(
        f"{preset}: every peer on 2 shared cores (load average {loadavg}){note}", fontsize=9
    )
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def markdown(preset: str, rows: dict, workers: int) -> str:
    """The peers table: ratios to webdataset in-process, per CPU-second and per second."""
    base = rows[("webdataset", 0)]
    peers = [p for p in ORDER if any(k[0] == p for k in rows)]
    head = (
        f"| {preset} | in-process, per CPU-s | in-process, samples/s | {workers} workers, per CPU-s "
        f"| {workers} workers, samples/s |"
    )
    lines = [head, "|---|---|---|---|---|"]

    def cell(peer: str, mode: int, what: str) -> str:
        r = rows.get((peer, mode))
        if r is None:
            return "-"
        if what not in r or not r[what]:
            return "failed: " + r.get("error", "?")[:70]
        return f"{r[what] / base[what]:.2f}"

    for peer in peers:
        name = f"**{peer}**" if peer.startswith("shardpipes") else peer
        cells = [
            cell(peer, m, w) for m in (0, workers) for w in ("samples_per_cpu_s", "samples_per_s")
        ]
        if cells[0].startswith("failed") and cells[1].startswith("failed"):
            cells[1] = ""
        if cells[2].startswith("failed") and cells[3].startswith("failed"):
            cells[3] = ""
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("json", help="the file bench.py --json wrote")
    ap.add_argument("--out", default=os.path.join("docs", "images"), help="directory of the PNGs")
    ap.add_argument("--markdown", action="store_true", help="also print the peers table per preset")
    args = ap.parse_args(argv)
    with open(args.json) as f:
        run = json.load(f)
    m = run["machine"]
    load = f"{min(m['loadavg_start'][0], m['loadavg_end'][0]):.0f}-{max(m['loadavg_start'][0], m['loadavg_end'][0]):.0f}"
    os.makedirs(args.out, exist_ok=True)
    for preset, results in run["results"].items():
        rows = _report.summarise(results)
        if ("webdataset", 0) not in rows or "samples_per_s" not in rows[("webdataset", 0)]:
            print(f"{preset}: no webdataset in-process row to compare with; skipped")
            continue
        path = os.path.join(args.out, f"peers-{preset}.png")
        plot(preset, rows, path, load)
        print(path)
        if args.markdown:
            print(markdown(preset, rows, run["args"]["workers"]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
