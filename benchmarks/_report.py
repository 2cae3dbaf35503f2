"""Medians, the table, the ratios and the targets of the performance issue."""

from __future__ import annotations

import statistics
from collections.abc import Iterable

__all__ = [
    "ALL_PEERS",
    "MODE_NAMES",
    "PEERS",
    "best_peer",
    "ratios",
    "rounds",
    "summarise",
    "table",
    "targets",
]

MODE_NAMES = {0: "in-process"}


# Every peer of the benchmark, in the order of its tables and plots (floors first).
ALL_PEERS = [
    "floor",
    "cat",
    "tarfile",
    "webdataset",
    "wids",
    "torchdata09",
    "torchdata09_dl",
    "litdata",
    "litdata_bare",
    "mosaic",
    "energon",
    "dali",
    "shardpipes",
    "shardpipes_dl2",
    "shardpipes_idx",
    "shardpipes_fused",
    "shardpipes_fused_t2",
    "shardpipes_fused_u8",
]


def mode_name(workers: int) -> str:
    return MODE_NAMES.get(workers, f"{workers} workers")


def summarise(results: Iterable[dict]) -> dict:
    """Group trial results by (peer, workers) and take medians."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in results:
        groups.setdefault((r["peer"], r["workers"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        ok = [r for r in rs if "error" not in r]
        row: dict = {
            "peer": key[0],
            "workers": key[1],
            "runs": len(ok),
            "failed": len(rs) - len(ok),
        }
        if not ok:
            row["error"] = rs[-1]["error"]
            out[key] = row
            continue
        sps = [r["samples"] / r["seconds"][-1] for r in ok]
        mbs = [r["bytes"] / r["seconds"][-1] / 1e6 for r in ok]
        row.update(
            loader=ok[-1]["loader"],
            samples=ok[-1]["samples"],
            expected=ok[-1]["expected"],
            samples_per_s=statistics.median(sps),
            mb_per_s=statistics.median(mbs),
            spread=(max(sps) - min(sps)) / statistics.median(sps) if len(sps) > 1 else 0.0,
            cpu_s=statistics.median(r["cpu_s"] for r in ok),
            samples_per_cpu_s=statistics.median(
                r["samples"] / r["cpu_s"] for r in ok if r["cpu_s"] > 0
            )
            if any(r["cpu_s"] > 0 for r in ok)
            else None,
            first_batch_s=_median_or_none(r["first_batch_s"] for r in ok),
            rss_main_mb=statistics.median(r["rss_main_mb"] for r in ok),
            rss_import_mb=statistics.median(r["rss_import_mb"] for r in ok),
            rss_children_mb=statistics.median(r["rss_children_mb"] for r in ok),
            versions=ok[-1]["versions"],
        )
        if any(r["samples"] != r["expected"] for r in ok):
            row["error"] = f"sample count {ok[-1]['samples']} != {ok[-1]['expected']}"
        out[key] = row
    return out


def _median_or_none(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def _fmt(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def table(rows: dict, order: list[str]) -> str:
    head = (
        "| peer | mode | samples/s | MB/s | spread | samples/CPU-s | CPU s | 1st batch s | "
        "peak RSS MB (main) | peak RSS MB (largest child) | runs |"
    )
    lines = [head, "|" + "---|" * 11]
    keys = sorted(rows, key=lambda k: (order.index(k[0]) if k[0] in order else 99, k[1]))
    for key in keys:
        r = rows[key]
        if "samples_per_s" not in r:
            lines.append(
                f"| {r['peer']} | {mode_name(r['workers'])} | failed: {r['error'][:80]} | | | | | | | | 0 |"
            )
            continue
        child = _fmt(r["rss_children_mb"]) if r["workers"] or r["peer"] == "cat" else "-"
        err = f" ({r['error']})" if "error" in r else ""
        lines.append(
            f"| {r['peer']}{err} | {mode_name(r['workers'])} | {_fmt(r['samples_per_s'])} | "
            f"{_fmt(r['mb_per_s'])} | {r['spread'] * 100:.0f}% | {_fmt(r['samples_per_cpu_s'])} | "
            f"{_fmt(r['cpu_s'], 2)} | {_fmt(r['first_batch_s'], 2)} | "
            f"{_fmt(r['rss_main_mb'])} | {child} | {r['runs']} |"
        )
    return "\n".join(lines)


def loaders(rows: dict) -> str:
    seen = {}
    for (peer, workers), r in sorted(rows.items()):
        if "loader" in r:
            seen[(peer, workers)] = r["loader"]
    return "\n".join(f"- {peer}, {mode_name(w)}: {text}" for (peer, w), text in seen.items())


def _get(rows: dict, peer: str, workers: int, what: str) -> float | None:
    r = rows.get((peer, workers))
    return r.get(what) if r else None


PEERS = (
    "webdataset",
    "torchdata09",
    "torchdata09_dl",
    "wids",
    "litdata",
    "litdata_bare",
    "mosaic",
    "energon",
    "dali",
)


def _ours(rows: dict) -> str:
    """The shardpipes row the ratios are of: the crop-decode stage where it ran (jpeg)."""
    return "shardpipes_fused" if any(k[0] == "shardpipes_fused" for k in rows) else "shardpipes"


def ratios(rows: dict, workers: int, limit: str = "cat") -> list[str]:
    out = []
    ours = _ours(rows)
    floor = _get(rows, "floor", 0, "samples_per_cpu_s")
    for peer in [p for p in ALL_PEERS if p != "floor"] if floor else []:
        cpu = _get(rows, peer, 0, "samples_per_cpu_s")
        if cpu:
            out.append(f"{peer}/floor (in-process, per CPU-second, medians): {cpu / floor:.2f}")
    for mode in (0, workers):
        sp = _get(rows, ours, mode, "samples_per_s")
        if sp is None:
            continue
        sp_cpu = _get(rows, ours, mode, "samples_per_cpu_s")
        others = (*PEERS, "tarfile", "shardpipes_dl2", "shardpipes_idx")
        if ours != "shardpipes":
            others = (*others, "shardpipes")
        for peer in others:
            other = _get(rows, peer, mode, "samples_per_s")
            other_cpu = _get(rows, peer, mode, "samples_per_cpu_s")
            if other:
                cpu = f"; per CPU-second {sp_cpu / other_cpu:.2f}x" if sp_cpu and other_cpu else ""
                out.append(f"{ours}/{peer} ({mode_name(mode)}): {sp / other:.2f}x{cpu}")
        cat = _get(rows, limit, 0, "mb_per_s")
        mb = _get(rows, ours, mode, "mb_per_s")
        if cat and mb:
            out.append(f"{ours}/limit ({limit} MB/s, {mode_name(mode)}): {mb / cat:.1%}")
    return out


def _epoch_rates(r: dict) -> list[float]:
    """Samples per CPU-second of each epoch of one trial (in-process rows: this process's CPU)."""
    return [r["samples"] / c for c in r.get("cpu_epochs_s") or [] if c > 0]


def _rate(x: float) -> str:
    """Samples per CPU-second: thousands with a ``k`` (small samples), whole samples (photographs)."""
    return f"{x / 1e3:.1f}k" if x >= 10_000 else f"{x:.0f}"


def rounds(results: Iterable[dict], workers: int = 0) -> list[str]:
    """Per round (one trial of every peer, run back to back): each in-process row's samples per
    CPU-second epoch by epoch, its last epoch against the ``floor`` row of the same round, and
    shardpipes against LitData bare in that round.

    On a shared machine a round's rows see much the same machine; the ratios within a round move
    less than the figures. LitData's epochs are listed one by one so that both of its modes show
    where they occur (``docs/performance.md``: "LitData bare and its two modes").
    """
    by_round: dict[int, dict[str, dict]] = {}
    for r in results:
        if "error" in r or r.get("workers") != workers or "round" not in r:
            continue
        by_round.setdefault(r["round"], {})[r["peer"]] = r
    if not by_round:
        return []
    peers = sorted(
        {p for rs in by_round.values() for p in rs},
        key=lambda p: ALL_PEERS.index(p) if p in ALL_PEERS else 99,
    )
    ours = [p for p in ("shardpipes", "shardpipes_idx", "shardpipes_dl2") if p in peers]
    lines = [
        "| round | "
        + " | ".join(f"{p} (per CPU-s by epoch; last / floor)" for p in peers)
        + "".join(f" | {p} / litdata_bare (last epoch)" for p in ours if "litdata_bare" in peers)
        + " |",
        "|---|" + "---|" * (len(peers) + (len(ours) if "litdata_bare" in peers else 0)),
    ]
    for rnd in sorted(by_round):
        rs = by_round[rnd]
        floor = (
            _epoch_rates(rs["floor"])[-1] if "floor" in rs and _epoch_rates(rs["floor"]) else None
        )
        cells = []
        for p in peers:
            rates = _epoch_rates(rs[p]) if p in rs else []
            if not rates:
                cells.append("-")
                continue
            text = "/".join(map(_rate, rates))
            if floor and p != "floor":
                text += f"; {rates[-1] / floor:.2f}"
            cells.append(text)
        lit = _epoch_rates(rs["litdata_bare"]) if "litdata_bare" in rs else []
        for p in ours if "litdata_bare" in peers else []:
            mine = _epoch_rates(rs[p]) if p in rs else []
            cells.append(f"{mine[-1] / lit[-1]:.2f}x" if mine and lit else "-")
        lines.append(f"| {rnd + 1} | " + " | ".join(cells) + " |")
    return lines


def best_peer(rows: dict, mode: int, what: str = "samples_per_cpu_s") -> tuple[str, float] | None:
    """The fastest peer (not shardpipes, not the limits) in ``mode`` by ``what``."""
    got = [(p, _get(rows, p, mode, what)) for p in PEERS]
    got = [(p, v) for p, v in got if v]
    return max(got, key=lambda x: x[1]) if got else None


def targets(preset: str, rows: dict, workers: int) -> list[str]:
    """The goals of the performance issue, with where we stand."""
    sp0 = _get(rows, "shardpipes", 0, "samples_per_s")
    spw = _get(rows, "shardpipes", workers, "samples_per_s")
    out = []

    def line(name: str, value: float | None, goal: float, unit: str = "x") -> None:
        if value is None:
            out.append(f"[ n/a ] {name}: not measured")
            return
        ok = "PASS" if value >= goal else "MISS"
        out.append(f"[{ok}] {name}: {value:.2f}{unit} (target >= {goal:g}{unit})")

    if preset in ("small", "quick"):
        for peer in ("webdataset", "torchdata09"):
            other = _get(rows, peer, 0, "samples_per_s")
            line(f"small in-process vs {peer}", sp0 / other if sp0 and other else None, 5)
        # torchdata 0.9's DataLoader2 + MultiProcessingReadingService fails on this data (see
        # docs/performance.md); its DataPipes under torch's DataLoader stand in for the ratio.
        line(
            f"small {workers} workers vs shardpipes in-process",
            spw / sp0 if spw and sp0 else None,
            1.7,
        )
        # the per-sample issue: 1.2x LitData per CPU-second in-process, ahead with workers,
        # for the README graph and the same graph with the index
        # (issue 42: LitData's StreamingDataset iterated bare, without its loader, as well)
        for ours_row in ("shardpipes", "shardpipes_idx"):
            for peer, mode, goal in (
                ("litdata", 0, 1.2),
                ("litdata_bare", 0, 1.2),
                ("litdata", workers, 1.0),
            ):
                a = _get(rows, ours_row, mode, "samples_per_cpu_s")
                b = _get(rows, peer, mode, "samples_per_cpu_s")
                line(
                    f"small {mode_name(mode)} per CPU-second: {ours_row} vs {peer}",
                    a / b if a and b else None,
                    goal,
                )
    if preset in ("jpeg", "quickjpeg"):
        for mode in (0, workers):
            ours = _get(rows, "shardpipes_fused", mode, "samples_per_cpu_s")
            wds = _get(rows, "webdataset", mode, "samples_per_cpu_s")
            line(
                f"jpeg {mode_name(mode)} per CPU-second vs webdataset + the transform",
                ours / wds if ours and wds else None,
                1.5,
            )
            best = best_peer(rows, mode)
            line(
                f"jpeg {mode_name(mode)} per CPU-second vs the best peer"
                + (f" ({best[0]})" if best else ""),
                ours / best[1] if ours and best else None,
                1.2,
            )
    # on every preset and mode: ahead of every peer that ran, per CPU-second and per second
    ours_name = _ours(rows)
    for mode in (0, workers):
        for what, label in (
            ("samples_per_cpu_s", "per CPU-second"),
            ("samples_per_s", "samples/s"),
        ):
            ours = _get(rows, ours_name, mode, what)
            best = best_peer(rows, mode, what)
            line(
                f"{preset} {mode_name(mode)} {label}: {ours_name} vs the best peer"
                + (f" ({best[0]})" if best else ""),
                ours / best[1] if ours and best else None,
                1.0,
            )
    if preset in ("large", "quick"):
        cat = _get(rows, "cat", 0, "mb_per_s")
        mb0 = _get(rows, "shardpipes", 0, "mb_per_s")
        mbw = _get(rows, "shardpipes", workers, "mb_per_s")
        line("large in-process vs cat MB/s", mb0 / cat if mb0 and cat else None, 0.6)
        line(
            f"large {workers} workers vs shardpipes in-process",
            mbw / mb0 if mbw and mb0 else None,
            1.0,
        )
    return out
