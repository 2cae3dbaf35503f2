"""URL resolution: the one place that turns relative shard references into URLs.

Local paths and ``file://`` URLs become absolute paths; other URLs (``s3://``, ``gs://``,
``https://``) keep their scheme, host and query. Used by the index (shard URLs stored relative
to the index file) and by dataset descriptors (``read_shard_list``).
"""

from __future__ import annotations

import os
import posixpath
from urllib.parse import urlsplit, urlunsplit

__all__ = ["SizedUrl", "absolute", "parent", "resolve", "url_dir", "url_join"]


class SizedUrl(str):
    """A URL that knows its object's size in bytes (from a shard index or a dataset descriptor).

    It is the URL string in every way (equality, hashing, JSON); ``open_files_by_fsspec`` reads
    ``size`` so that opening it on S3 or GCS costs no size look-up (a ``HEAD``). A stale size
    (the object changed since) fails the read with an error naming the URL; it is never
    silently cut.

    Examples:
        >>> u = SizedUrl("s3://b/train-0.tar", 4096)
        >>> u == "s3://b/train-0.tar", u.size, {u: 1}["s3://b/train-0.tar"]
        (True, 4096, 1)
    """

    size: int

    def __new__(cls, url: str, size: int) -> SizedUrl:
        """``url`` with ``size`` attached."""
        obj = super().__new__(cls, url)
        obj.size = int(size)
        return obj

    def __reduce__(self) -> tuple[object, ...]:
        return (SizedUrl, (str(self), self.size))


def absolute(url: str) -> str:
    """Local paths (and ``file://`` URLs) become absolute paths; other URLs stay as they are."""
    if url.startswith("file://"):
        url = url[len("file://") :]
    if "://" in url:
        return url
    return os.path.abspath(url)


def parent(url: str) -> str:
    """The folder of an absolute local path or URL (``/`` for a file at the root)."""
    return url.rstrip("/").rsplit("/", 1)[0] or "/"


def url_dir(url: str) -> str:
    """The directory of ``url`` (keeps scheme, host and query, drops the last path part)."""
    if "://" not in url:
        return os.path.dirname(url) or "."
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=posixpath.dirname(parts.path)))


def url_join(base: str, ref: str) -> str:
    """``ref`` resolved against the directory URL ``base``, as wids' ``urlmerge`` does.

    Examples:
        >>> url_join("s3://bucket/data", "train-0.tar")
        's3://bucket/data/train-0.tar'
        >>> url_join("https://host/d?x=1", "../t.tar")
        'https://host/t.tar'
        >>> url_join("/d", "gs://other/t.tar")
        'gs://other/t.tar'
    """
    if "://" in ref:
        return ref
    if "://" not in base:
        return ref if os.path.isabs(ref) else os.path.normpath(os.path.join(base, ref))
    parts = urlsplit(base)
    ref_parts = urlsplit(ref)
    path = (
        ref_parts.path
        if ref_parts.path.startswith("/")
        else posixpath.normpath(posixpath.join(parts.path or "/", ref_parts.path))
    )
    if parts.netloc and not path.startswith("/"):
        path = "/" + path
    return urlunsplit((parts.scheme, parts.netloc, path, ref_parts.query, ref_parts.fragment))


def resolve(stored: str, base_dir: str) -> str:
    """A URL stored relative to ``base_dir`` (e.g. in an index file), made absolute."""
    return absolute(url_join(base_dir, stored))
