"""webdataset's field-pattern stages: ``extract_keys``, ``rename_keys``, ``xdecode``; ``Cached`` and ``LMDBCached``."""

from __future__ import annotations

import importlib
import io
import os
import pickle
import re
import types
from collections.abc import Iterable, Iterator
from fnmatch import fnmatch
from typing import Any

from shardpipes.webdataset import utils
from shardpipes.webdataset._curry import pipelinefilter

__all__ = [
    "Cached",
    "ExtractKeys",
    "LMDBCached",
    "RenameKeys",
    "XDecode",
    "default_decoders",
    "extract_keys",
    "rename_keys",
    "xdecode",
]


class ExtractKeys:
    """``extract_keys(*patterns)``'s function of one sample: the fields matching the patterns, as a tuple."""

    def __init__(
        self,
        patterns: tuple[Any, ...],
        duplicate_is_error: bool = True,
        ignore_missing: bool = False,
    ) -> None:
        self.patterns = patterns
        self.duplicate_is_error = duplicate_is_error
        self.ignore_missing = ignore_missing

    def __call__(self, sample: dict[str, Any]) -> tuple[Any, ...]:
        """The matching fields of ``sample``."""
        result = []
        for pattern in self.patterns:
            alts = pattern.split(";") if isinstance(pattern, str) else pattern
            matches = [x for x in sample if any(fnmatch("." + x, p) or fnmatch(x, p) for p in alts)]
            if not matches:
                if self.ignore_missing:
                    continue
                raise ValueError(f"Cannot find {alts} in sample keys {sample.keys()}.")
            if len(matches) > 1 and self.duplicate_is_error:
                raise ValueError(f"Multiple sample keys {sample.keys()} match {alts}.")
            result.append(sample[matches[0]])
        return tuple(result)


def _extract_keys(
    source: Iterable[Any],
    *patterns: Any,
    duplicate_is_error: bool = True,
    ignore_missing: bool = False,
) -> Iterator[Any]:
    extract = ExtractKeys(patterns, duplicate_is_error, ignore_missing)
    for sample in source:
        yield extract(sample)


extract_keys = pipelinefilter(_extract_keys)


class RenameKeys:
    """``rename_keys(new="pattern", ...)``'s function of one sample."""

    def __init__(
        self,
        args: tuple[Any, ...],
        kw: dict[str, Any],
        keep_unselected: bool = False,
        must_match: bool = True,
        duplicate_is_error: bool = True,
    ) -> None:
        self.renamings = [(pattern, output) for output, pattern in args]
        self.renamings += [(pattern, output) for output, pattern in kw.items()]
        self.keep_unselected = keep_unselected
        self.must_match = must_match
        self.duplicate_is_error = duplicate_is_error

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        """``sample`` with its fields renamed."""
        new: dict[str, Any] = {}
        matched = {k: False for k, _ in self.renamings}
        for path, value in sample.items():
            fname = re.sub(r".*/", "", path)
            name = None
            for pattern, out in self.renamings[::-1]:
                if fnmatch(fname.lower(), pattern):
                    matched[pattern] = True
                    name = out
                    break
            if name is None:
                if self.keep_unselected:
                    new[path] = value
                continue
            if name in new:
                if self.duplicate_is_error:
                    raise ValueError(f"Duplicate value in sample {sample.keys()} after rename.")
                continue
            new[name] = value
        if self.must_match and not all(matched.values()):
            raise ValueError(f"Not all patterns ({matched}) matched sample keys ({sample.keys()}).")
        return new


def _rename_keys(
    source: Iterable[Any],
    *args: Any,
    keep_unselected: bool = False,
    must_match: bool = True,
    duplicate_is_error: bool = True,
    **kw: Any,
) -> Iterator[Any]:
    rename = RenameKeys(args, kw, keep_unselected, must_match, duplicate_is_error)
    for sample in source:
        yield rename(sample)


rename_keys = pipelinefilter(_rename_keys)


def _decode_bin(stream: io.BytesIO) -> bytes:
    return stream.read()


def _decode_text(stream: io.BytesIO) -> str:
    return stream.read().decode("utf-8")


def _decode_pickle(stream: io.BytesIO) -> Any:
    if utils.enforce_security:
        raise ValueError(
            "Unpickling is not allowed for security reasons when enforce_security is set"
        )
    return pickle.load(stream)


default_decoders = [("*.bin", _decode_bin), ("*.txt", _decode_text), ("*.pyd", _decode_pickle)]


def _find_decoder(decoders: list[tuple[str, Any]], path: str) -> Any:
    fname = re.sub(r".*/", "", path)
    if fname.startswith("__"):
        return utils.identity
    for pattern, fun in decoders[::-1]:
        if fnmatch(fname.lower(), pattern) or fnmatch("." + fname.lower(), pattern):
            return fun
    return None


class XDecode:
    """``xdecode(("*.png", f), ...)``'s function of one sample."""

    def __init__(
        self,
        args: tuple[Any, ...],
        kw: dict[str, Any],
        must_decode: bool = True,
        defaults: Any = default_decoders,
    ) -> None:
        self.decoders = [*defaults, *args, *(("*." + k, v) for k, v in kw.items())]
        self.must_decode = must_decode

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        """``sample`` with its fields decoded."""
        new = {}
        for path, data in sample.items():
            if path.startswith("__"):
                new[path] = data
                continue
            decoder = _find_decoder(self.decoders, path)
            if decoder is False:
                value = data
            elif decoder is None:
                if self.must_decode:
                    raise ValueError(f"No decoder found for {path}.")
                value = data
            else:
                value = decoder(io.BytesIO(data) if isinstance(data, bytes) else data)
            new[path] = value
        return new


def _xdecode(
    source: Iterable[Any],
    *args: Any,
    must_decode: bool = True,
    defaults: Any = default_decoders,
    **kw: Any,
) -> Iterator[Any]:
    decode = XDecode(args, kw, must_decode, defaults)
    for sample in source:
        yield decode(sample)


xdecode = pipelinefilter(_xdecode)


class Cached(utils.PipelineStage):
    """Keep the first pass in memory and replay it on later passes (``.mcached()``)."""

    def __init__(self) -> None:
        self.cached: list[Any] | None = None

    def run(self, source: Iterable[Any]) -> Iterator[Any]:
        """Yield the source, recording it on the first pass; replay the record later."""
        if self.cached is not None:
            yield from self.cached
            return
        temp = []
        for sample in source:
            temp.append(sample)
            yield sample
        self.cached = temp


class LMDBCached(utils.PipelineStage):
    """Record the first whole pass in an LMDB database at ``fname``; later passes replay it.

    webdataset's ``LMDBCached`` (``.lmdb_cached(fname)``; needs ``lmdb``), with two differences:

    - Samples are stored under their position in the pass, not under ``__key__``: two samples
      with one key (two shards that both name theirs ``000000``) are both kept, and a replay
      yields the samples in the order of the pass that recorded them (webdataset stores by
      key, so one of the two is lost and a replay comes in key order).
    - One reader only: the database is one file, and with several readers (worker processes,
      ranks) each would record its own share and the first to finish would mark it complete,
      so a replay would miss the rest. Under more than one reader, iterating raises
      ``ValueError``; ``mcached()`` keeps a copy per reader in memory instead.

    A pass that stops early leaves the database incomplete; the next pass records again. The
    samples are pickled (``pickler``): point ``fname`` only at a database this code wrote.
    """

    def __init__(
        self, fname: str, map_size: float = 1e12, pickler: Any = pickle, chunksize: int = 500
    ) -> None:
        import lmdb  # noqa: F401  (fails here, as in webdataset, when lmdb is not installed)

        self.fname = fname
        self.map_size = int(map_size)
        self.pickler = pickler
        self.chunksize = chunksize
        self._db: Any = None  # opened in the process that iterates (an LMDB handle does not fork)

    def __getstate__(self) -> dict[str, Any]:
        # For worker processes and DataLoader2's copy of the graph: no database handle, and a
        # pickler module (the default, pickle) by its name.
        state = dict(self.__dict__)
        state["_db"] = None
        if isinstance(self.pickler, types.ModuleType):
            state["pickler"] = _ByName(self.pickler.__name__)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if isinstance(state["pickler"], _ByName):
            state["pickler"] = importlib.import_module(state["pickler"].name)
        self.__dict__.update(state)

    def _env(self) -> Any:
        if self._db is None:
            # One handle per file and process: LMDB forbids opening a file twice in one process,
            # and DataLoader2 iterates a copy of the stage a user may also have iterated.
            where = (os.getpid(), os.path.abspath(self.fname))
            self._db = _ENVS.get(where)
            if self._db is None:
                import lmdb

                self._db = _ENVS[where] = lmdb.open(
                    self.fname, readonly=False, map_size=self.map_size
                )
        return self._db

    def is_complete(self) -> bool:
        """Whether a whole pass has been recorded."""
        with self._env().begin(write=False) as txn:
            return txn.get(_COMPLETE) is not None

    def add_samples(self, samples: Iterable[tuple[bytes, Any]]) -> None:
        """Store ``(key, sample)`` pairs in one transaction."""
        with self._env().begin(write=True) as txn:
            for key, sample in samples:
                txn.put(key, self.pickler.dumps(sample))

    def run(self, source: Iterable[Any]) -> Iterator[Any]:
        """Replay the recorded pass, or record this one while yielding it."""
        _, world, _, workers = utils.pytorch_worker_info()
        if world * workers > 1:
            raise ValueError(
                f"LMDBCached({self.fname!r}) records one reader's pass, and this pass has "
                f"{world * workers} readers ({world} rank(s) x {workers} worker(s)): each "
                "would record only its share; use one reader, or mcached() (a copy per reader)"
            )
        if self.is_complete():
            with self._env().begin(write=False) as txn:
                for key, value in txn.cursor():
                    if key != _COMPLETE:
                        yield self.pickler.loads(value)
            return
        with self._env().begin(write=True) as txn:
            txn.drop(self._env().open_db(txn=txn), delete=False)  # an unfinished pass's
        buffer: list[tuple[bytes, Any]] = []
        for i, sample in enumerate(source):
            buffer.append((b"%012d" % i, sample))
            if len(buffer) >= self.chunksize:
                self.add_samples(buffer)
                buffer = []
            yield sample
        self.add_samples(buffer)
        with self._env().begin(write=True) as txn:
            txn.put(_COMPLETE, b"1")


_COMPLETE = b"_"  # sorts after the zero-padded positions
_ENVS: dict[tuple[int, str], Any] = {}  # (pid, path) -> the open LMDB environment


class _ByName:
    def __init__(self, name: str) -> None:
        self.name = name
