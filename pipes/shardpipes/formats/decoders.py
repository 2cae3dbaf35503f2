"""Field decoders by extension: the one registry that ``decode()``, webdataset and wids read.

A sample field is decoded by its extension (``.cls`` -> ``int``, ``.json`` -> objects, ``.npy``
-> an array, ...). :data:`DECODERS` maps every extension shardpipes decodes to its decoder,
and never unpickles; :data:`PICKLE_DECODERS` holds the decoders that unpickle (``pickle``,
``pyd``, ``pkl``, and ``pt``/``pth`` with full pickles), used only with the switch on:
:func:`decoders` ``(allow_pickle=True)``. The front ends differ only in which extensions they
know (webdataset's and wids' lists are theirs) and in how they decode images.

Examples:
    >>> table = decoders()
    >>> lookup(table, ".cls")(b"7"), lookup(table, ".seg.json")(b'{"a": 1}'), lookup(table, ".bin")
    (7, {'a': 1}, None)
    >>> "pickle" in table, "pickle" in decoders(allow_pickle=True)
    (False, True)
"""

from __future__ import annotations

import io
import json
import json.scanner
import pickle
from collections.abc import Callable, Iterable, Mapping
from itertools import repeat
from operator import itemgetter
from typing import Any

__all__ = [
    "DECODERS",
    "PICKLE_DECODERS",
    "Decoder",
    "decode_int",
    "decode_json",
    "decode_json_values",
    "decode_npy",
    "decode_npz",
    "decode_pickle",
    "decode_text",
    "decode_torch",
    "decode_torch_pickle",
    "decoders",
    "lookup",
]

Decoder = Callable[[bytes], Any]


def decode_int(data: bytes) -> int:
    """Decimal text -> ``int``."""
    return int(data)


def decode_text(data: bytes) -> str:
    """UTF-8 -> ``str``."""
    return data.decode("utf-8")


_scan_json = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # typeshed has it wrong


def decode_json(data: bytes) -> Any:
    """JSON -> Python objects."""
    # json.loads(bytes) spends more time guessing the encoding and wrapping its C scanner than
    # scanning a small document; go to the scanner directly for the usual case (UTF-8, no
    # leading space), and leave everything else, errors included, to json.loads.
    try:
        text = data.decode("utf-8")
        value, end = _scan_json(text, 0)
    except (StopIteration, UnicodeDecodeError, ValueError):
        return json.loads(data)
    if end != len(text) and text[end:].strip(" \t\n\r"):
        return json.loads(data)  # extra data: json.loads raises the error
    return value


def decode_json_values(data: list[Any]) -> list[Any]:
    """:func:`decode_json` of each of ``data`` (bytes-like values), in order, as a list.

    The same values, and the same error where one fails: in the usual case (every value UTF-8
    text holding one document and nothing after it) the scanner runs over the whole list with
    no Python frame per value; otherwise each value goes through :func:`decode_json`.
    """
    try:
        texts = list(map(str, data, repeat("utf-8")))
        found = list(map(_scan_json, texts, repeat(0)))
    except (StopIteration, UnicodeDecodeError, ValueError):
        return list(map(decode_json, map(bytes, data)))
    if list(map(len, texts)) != list(map(_second, found)):  # text after a document
        return list(map(decode_json, map(bytes, data)))
    return list(map(_first, found))


_first, _second = itemgetter(0), itemgetter(1)


def decode_npy(data: bytes) -> Any:
    """A ``.npy`` array (never with pickled objects)."""
    import numpy as np

    return np.load(io.BytesIO(data), allow_pickle=False)


def decode_npz(data: bytes) -> dict[str, Any]:
    """A ``.npz`` archive -> a dict of arrays (never with pickled objects)."""
    import numpy as np

    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def decode_torch(data: bytes) -> Any:
    """``torch.load(weights_only=True)`` on the CPU: tensors and plain containers, no pickles."""
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def decode_torch_pickle(data: bytes) -> Any:
    """``torch.load(weights_only=False)`` on the CPU: full pickles; only for data you trust."""
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def decode_pickle(data: bytes) -> Any:
    """``pickle.loads``; only for data you trust."""
    return pickle.loads(data)


#: Extension (the last component, without dot) -> decoder; nothing here unpickles.
DECODERS: dict[str, Decoder] = {
    **dict.fromkeys(("cls", "cls2", "class", "count", "index", "inx", "id"), decode_int),
    **dict.fromkeys(("txt", "text", "transcript"), decode_text),
    **dict.fromkeys(("json", "jsn"), decode_json),
    "npy": decode_npy,
    "npz": decode_npz,
    **dict.fromkeys(("pt", "pth"), decode_torch),
}

#: The decoders that unpickle, by extension: used only with ``allow_pickle=True``.
PICKLE_DECODERS: dict[str, Decoder] = {
    **dict.fromkeys(("pickle", "pyd", "pkl"), decode_pickle),
    **dict.fromkeys(("pt", "pth"), decode_torch_pickle),
}


def decoders(
    extensions: Iterable[str] | None = None, *, allow_pickle: bool = False
) -> dict[str, Decoder]:
    """The decoder table: :data:`DECODERS`, with :data:`PICKLE_DECODERS` over it if allowed.

    Args:
        extensions: Keep only these extensions (a front end's list). Default: all.
        allow_pickle: The secure-unpickling switch: ``False`` (default) never unpickles.
    """
    table = {**DECODERS, **PICKLE_DECODERS} if allow_pickle else dict(DECODERS)
    if extensions is not None:
        keep = set(extensions)
        table = {k: v for k, v in table.items() if k in keep}
    return table


def lookup(table: Mapping[str, Decoder], field: str) -> Decoder | None:
    """The decoder of ``field`` (``".seg.png"``): by its whole extension, else by its last part."""
    return table.get(field.lstrip("."), table.get(field.rsplit(".", 1)[-1]))
