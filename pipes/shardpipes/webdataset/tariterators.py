"""webdataset's ``tariterators``: the generator functions its tar reading is built from.

Code that builds its own reader from these parts (open_clip's ``tarfile_to_samples_nothrow``:
``url_opener`` -> ``tar_file_expander`` -> its own grouping with ``base_plus_ext`` and
``valid_sample``) runs with webdataset 1.x's names, arguments and items: ``url_opener`` adds
``stream`` to each ``{"url": ...}``, ``tar_file_expander`` yields ``{"fname", "data",
"__url__"}`` per member (and ``eof_value`` after each shard), ``group_by_keys`` makes samples.
Opening goes through :func:`shardpipes.webdataset.gopen.gopen` (its ``gopen_schemes``) (storage, parsed ``pipe:``
URLs) and tar parsing through shardpipes' own reader; ``data`` is ``bytes``.

One difference: ``tar_file_expander``'s ``eof_value`` defaults to ``None`` (no end-of-shard
marker), as in webdataset 0.2, because code written against 0.2 (open_clip pins
``webdataset<=0.2.86``) takes every item for a member; ``group_by_keys`` still ends a sample
at a shard boundary (a new ``__url__``) and at an ``eof_value`` of ``{}`` when one is passed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from shardpipes.formats.tarparse import iter_tar
from shardpipes.webdataset._curry import pipelinefilter
from shardpipes.webdataset.gopen import gopen
from shardpipes.webdataset.handlers import reraise_exception
from shardpipes.webdataset.shardlists import expand_urls

__all__ = [
    "base_plus_ext",
    "group_by_keys",
    "meta_prefix",
    "meta_suffix",
    "shardlist",
    "tar_file_expander",
    "tar_file_iterator",
    "tarfile_samples",
    "tarfile_to_samples",
    "url_opener",
    "valid_sample",
]

meta_prefix = "__"
meta_suffix = "__"

Handler = Callable[[BaseException], bool]
_BASE_PLUS_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def base_plus_ext(path: str) -> tuple[str, str] | tuple[None, None]:
    """Split ``path`` at the first dot of its basename: ``("dir/key", "seg.png")``, else ``(None, None)``.

    Examples:
        >>> base_plus_ext("a/b.seg.png"), base_plus_ext("a.b/c")
        (('a/b', 'seg.png'), (None, None))
    """
    match = _BASE_PLUS_EXT.match(path)
    if not match:
        return None, None
    return match.group(1), match.group(2)


def valid_sample(sample: Any) -> bool:
    """Whether ``sample`` is a non-empty dict not marked ``__bad__``."""
    return (
        sample is not None
        and isinstance(sample, dict)
        and len(sample) > 0
        and not sample.get("__bad__", False)
    )


def shardlist(urls: str | Iterable[str], *, shuffle: bool = False) -> Iterator[dict[str, str]]:
    """``{"url": u}`` for each URL (brace-expanded from a string); ``shuffle`` is refused.

    Raises:
        ValueError: ``shuffle=True``: an unseeded shuffle; shuffle with ``wds.shuffle``/``detshuffle``.
    """
    if shuffle:
        raise ValueError("shardlist(shuffle=True) is unseeded; use detshuffle() or shuffle()")
    for url in expand_urls(urls) if isinstance(urls, str) else list(urls):
        yield {"url": url}


def url_opener(
    data: Iterable[dict[str, Any]], handler: Handler = reraise_exception, **kw: Any
) -> Iterator[dict[str, Any]]:
    """Add ``stream`` (the opened URL, via ``gopen``) to each ``{"url": ...}``."""
    for sample in data:
        if not isinstance(sample, dict) or "url" not in sample:
            raise TypeError(f"url_opener needs {{'url': ...}} items, got {sample!r}")
        url = sample["url"]
        try:
            stream = gopen(url, **kw)
            sample.update(stream=stream)
            yield sample
        except Exception as exn:
            exn.args = (*exn.args, url)
            if handler(exn):
                continue
            break


def tar_file_iterator(
    fileobj: IO[bytes],
    skip_meta: str | None = r"__[^/]*__($|/)",
    handler: Handler = reraise_exception,
    select_files: Callable[[str], bool] | None = None,
    rename_files: Callable[[str], str] | None = None,
) -> Iterator[dict[str, Any]]:
    """``{"fname", "data"}`` for each regular member of the tar stream ``fileobj``."""
    url = str(getattr(fileobj, "name", "") or fileobj)
    try:
        for entry in iter_tar(fileobj, url):
            fname = entry.name
            try:
                if (
                    "/" not in fname
                    and fname.startswith(meta_prefix)
                    and fname.endswith(meta_suffix)
                ):
                    continue
                if skip_meta is not None and re.match(skip_meta, fname):
                    continue
                if rename_files:
                    fname = rename_files(fname)
                if select_files is not None and not select_files(fname):
                    continue
                yield {"fname": fname, "data": entry.data.getvalue()}
            except Exception as exn:
                exn.args = (f"{exn.args[0] if exn.args else exn} @ {url}", *exn.args[1:])
                if handler(exn):
                    continue
                return
    except Exception as exn:
        if not handler(exn):
            return


def tar_file_expander(
    data: Iterable[dict[str, Any]],
    handler: Handler = reraise_exception,
    select_files: Callable[[str], bool] | None = None,
    rename_files: Callable[[str], str] | None = None,
    eof_value: Any = None,
) -> Iterator[dict[str, Any]]:
    """The members of each opened shard (``{"url", "stream"}``) with ``__url__``; ``eof_value`` after each."""
    for source in data:
        url = source.get("url") if isinstance(source, dict) else None
        try:
            if not isinstance(source, dict) or "stream" not in source:
                raise TypeError(
                    f"tar_file_expander needs {{'url', 'stream'}} items, got {source!r}"
                )
            local_path = source.get("local_path")
            stream = source["stream"]
            try:
                for sample in tar_file_iterator(
                    stream, handler=handler, select_files=select_files, rename_files=rename_files
                ):
                    sample["__url__"] = url
                    if local_path is not None:
                        sample["__local_path__"] = local_path
                    yield sample
            finally:
                stream.close()
            if eof_value is not None:
                yield eof_value
        except Exception as exn:
            exn.args = (*exn.args, source.get("stream") if isinstance(source, dict) else None, url)
            if handler(exn):
                continue
            break


def group_by_keys(
    data: Iterable[dict[str, Any]],
    keys: Callable[[str], tuple[Any, Any]] = base_plus_ext,
    lcase: bool = True,
    suffixes: set[str] | None = None,
    handler: Handler = reraise_exception,
) -> Iterator[dict[str, Any]]:
    """Group consecutive ``{"fname", "data", "__url__"}`` items with one key into samples.

    Raises:
        ValueError: Two members of one sample have the same suffix (through ``handler``).
    """
    current: dict[str, Any] | None = None
    for filesample in data:
        try:
            if filesample == {}:  # an end-of-shard marker
                if valid_sample(current):
                    yield current  # type: ignore[misc]
                current = None
                continue
            fname, value = filesample["fname"], filesample["data"]
            prefix, suffix = keys(fname)
            if prefix is None:
                continue
            if lcase:
                suffix = suffix.lower()
            if (
                current is None
                or prefix != current["__key__"]
                or filesample.get("__url__") != current.get("__url__")
            ):
                if valid_sample(current):
                    yield current  # type: ignore[misc]
                current = {"__key__": prefix, "__url__": filesample.get("__url__")}
            if suffix in current:
                raise ValueError(
                    f"{fname}: duplicate file name in tar file {suffix} {list(current.keys())}"
                )
            if suffixes is None or suffix in suffixes:
                current[suffix] = value
            local_path = filesample.get("__local_path__")
            if local_path is not None:
                current["__local_path__"] = local_path
        except Exception as exn:
            exn.args = (*exn.args, filesample.get("stream"), filesample.get("url"))
            if handler(exn):
                continue
            break
    if valid_sample(current):
        yield current  # type: ignore[misc]


def tarfile_samples(
    src: Iterable[dict[str, Any]],
    handler: Handler = reraise_exception,
    select_files: Callable[[str], bool] | None = None,
    rename_files: Callable[[str], str] | None = None,
) -> Iterator[dict[str, Any]]:
    """Open, expand and group: the samples of the shards ``src`` (``{"url": ...}`` items)."""
    streams = url_opener(src, handler=handler)
    files = tar_file_expander(
        streams, handler=handler, select_files=select_files, rename_files=rename_files
    )
    return group_by_keys(files, handler=handler)


#: The curried stage, as in webdataset (``tariterators.tarfile_to_samples(handler=...)``).
tarfile_to_samples = pipelinefilter(tarfile_samples)
