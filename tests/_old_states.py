"""Loader states written by shardpipes at 094ef5b (before the typed state), and what followed them.

``python tests/_old_states.py`` (run once, with the code at 094ef5b) wrote
``tests/data/loader-states-094ef5b.json``: for each case the state ``state_dict()`` returned
and the batches the uninterrupted run yielded after it. ``tests/test_old_states.py`` loads those
states with today's code and checks that the same batches follow. The shards are written in
the current directory with relative names, so the states' bindings (hashes of the shard names
and index entries) are the same on every machine.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from _graphs import id_graph, indexed_graph
from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.index import build_index, default_index_url
from shardpipes.synthetic import write_synthetic

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "data", "loader-states-094ef5b.json")
COUNTS = [37, 20, 51, 8, 44]  # 160 samples: 40 batches of 4 per epoch
PATTERN = "main/train-{000000..000004}.tar"
MIX_COUNTS = {"a": [7, 9, 11, 5], "b": [6, 4, 8]}


def write_data() -> None:
    """The shards and indexes of every case, under the current directory."""
    paths = write_synthetic("main", shards=len(COUNTS), samples=COUNTS, payload_bytes=16)
    build_index(paths, progress=False).save(default_index_url(paths))
    for name, counts in MIX_COUNTS.items():
        write_synthetic(f"mix-{name}", shards=len(counts), samples=counts, payload_bytes=8)


class _Tag:
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, sample: dict[str, Any]) -> str:
        return f"{self.name}{json.loads(bytes(sample['.json']))['id']}"


def _mix_source(name: str) -> Any:
    urls = [f"mix-{name}/train-{i:06d}.tar" for i in range(len(MIX_COUNTS[name]))]
    index = build_index(urls, progress=False)
    return (
        IterableWrapper(urls)
        .shuffle()
        .sharding_by_index(index)
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .map(_Tag(name))
    )


def mixed() -> Any:
    return _mix_source("a").mix(_mix_source("b"), names=["a", "b"], repeat=[1, 2]).batch(4)


GRAPHS: dict[str, Callable[[], Any]] = {
    "plain": lambda: id_graph(PATTERN),
    "indexed": lambda: indexed_graph(PATTERN),
    "mixed": mixed,
}


def mp(workers: int) -> MultiProcessingReadingService:
    return MultiProcessingReadingService(num_workers=workers, multiprocessing_context="fork")


#: name -> (graph, workers before, batches before the state, seeded, workers after, exact).
#: ``exact``: the batches after the state are those of the run; else the same samples, each once.
CASES: dict[str, tuple[str, int, int, bool, int, bool]] = {
    "replay-inproc": ("plain", 0, 5, True, 0, True),
    "replay-mp2": ("plain", 2, 7, True, 2, True),
    "replay-unseeded": ("plain", 0, 4, False, 0, True),
    "seek-inproc": ("indexed", 0, 9, True, 0, True),
    "seek-mp2": ("indexed", 2, 6, True, 2, True),
    "elastic-mp2-to-inproc": ("indexed", 2, 6, True, 0, False),
    "seek-epoch1": ("indexed", 0, 45, True, 0, True),
    "boundary": ("indexed", 2, 40, True, 2, True),
    "start": ("plain", 0, 0, True, 0, True),
    "mixture": ("mixed", 0, 3, True, 0, True),
}


def _run(graph: str, workers: int, seeded: bool) -> tuple[list[Any], list[dict[str, Any]]]:
    """Two epochs, the state after each batch (the last state of an epoch: after it ended)."""
    batches: list[Any] = []
    states: list[dict[str, Any]] = []
    torch.manual_seed(11)
    with DataLoader2(GRAPHS[graph](), reading_service=mp(workers)) as dl:
        if seeded:
            dl.seed(3)
        states.append(dl.state_dict())
        for _ in range(2):
            for b in dl:
                batches.append(list(b))
                states.append(dl.state_dict())
            states[-1] = dl.state_dict()
    return batches, states


def _second_resume() -> dict[str, Any]:
    """A state with an earlier stretch: 2 workers for 6 batches, then 3 workers for 5 more."""
    _, states = _run("indexed", 2, True)
    with DataLoader2(indexed_graph(PATTERN), reading_service=mp(3)) as dl:
        dl.load_state_dict(states[6])
        it = iter(dl)
        for _ in range(5):
            next(it)
        state = dl.state_dict()
        rest = [list(b) for b in it] + [list(b) for b in dl]
    return {"graph": "indexed", "workers": 3, "exact": True, "state": state, "after": rest}


def generate() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (graph, before, k, seeded, after, exact) in CASES.items():
        batches, states = _run(graph, before, seeded)
        rest = batches[k:] if exact else batches[k : len(batches) // 2]
        out[name] = {"graph": graph, "workers": after, "exact": exact, "state": states[k]}
        out[name]["after"] = rest
    out["second-resume"] = _second_resume()
    return out


if __name__ == "__main__":
    import tempfile

    sys.path.insert(0, HERE)
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        write_data()
        found = generate()
    os.makedirs(os.path.dirname(FIXTURE), exist_ok=True)
    with open(FIXTURE, "w") as f:
        json.dump(found, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print({k: (v["state"]["consumed"], len(v["after"])) for k, v in found.items()})
