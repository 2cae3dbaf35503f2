"""The names stages go by in telemetry and in ``shardpipes bench --profile``: one rule for both.

The rule for one stage, :func:`stage_name`, is the loader's (``dataloader2/graph``), so the
loader's warnings name stages as telemetry does.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes.dataloader2.graph import registered_names, stage_name, stages_of

__all__ = ["stage_labels", "stage_name"]


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
