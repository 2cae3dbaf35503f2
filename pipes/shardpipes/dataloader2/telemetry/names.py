"""The names stages go by in telemetry and in ``shardpipes bench --profile``: one rule for both."""

from __future__ import annotations

from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes.dataloader2.graph import registered_names, stages_of
from shardpipes.datapipes.iter._unhooked import torch_kind

__all__ = ["stage_labels", "stage_name"]


def stage_name(dp: Any, registered: dict[type, str] | None = None) -> str:
    """``dp``'s functional name (``map``, ``decode``), also for the loader's lean stand-ins.

    A stage without one is named by its class, less ``IterDataPipe`` (``IterableWrapper``).
    """
    names = registered if registered is not None else registered_names()
    kind = type(dp)
    if kind in names:
        return names[kind]
    replaced = getattr(kind, "stands_for", None)
    if isinstance(replaced, type):  # a lean stand-in: the name of the stage it replaces
        if replaced in names:
            return names[replaced]
        # torch's stage runs as our unhooked subclass of it, registered under its name
        found = [name for cls, name in names.items() if torch_kind(cls) is replaced]
        if found:
            return found[0]
    for k in kind.__mro__[1:]:
        if k is not IterDataPipe and k in names:
            return names[k]
    return kind.__name__.removesuffix("IterDataPipe")


def stage_labels(datapipe: IterDataPipe[Any]) -> dict[int, str]:
    """``id(stage) -> label`` for every stage of the graph ending in ``datapipe``.

    The label is the stage's name, with ``#2``, ``#3`` for the second and third stage of one
    name counted from the source: so the copy of the graph a worker runs (the graph without
    its main-process tail) labels its stages as the main process does.
    """
    registered = registered_names()
    seen: dict[str, int] = {}
    labels: dict[int, str] = {}
    for dp in reversed(stages_of(datapipe)):
        name = stage_name(dp, registered)
        seen[name] = seen.get(name, 0) + 1
        labels[id(dp)] = name if seen[name] == 1 else f"{name}#{seen[name]}"
    return labels
