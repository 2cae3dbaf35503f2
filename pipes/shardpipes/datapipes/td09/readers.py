"""torchdata 0.9's remote readers on fsspec: ``read_from_http``, ``read_from_remote``, ``read_from_gdrive``, ``list_files_by_s3``, ``load_files_by_s3``.

HTTP and S3 go through ``FSSpecFileLister``/``FSSpecFileOpener`` (fsspec's HTTP filesystem and
s3fs), so they get shardpipes' ranged reads and retries with resume. Google Drive needs a cookie
handshake before the download, done with ``requests`` (``pip install 'shardpipes[http]'``).
"""

from __future__ import annotations

import re
import urllib.parse
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.utils.common import StreamWrapper, match_masks

from shardpipes.datapipes.iter.base import StageIterDataPipe, register
from shardpipes.datapipes.iter.fsspec import FSSpecFileOpenerIterDataPipe as FSSpecFileOpener

__all__ = [
    "GDriveReaderDataPipe",
    "HTTPReaderIterDataPipe",
    "OnlineReaderIterDataPipe",
    "S3FileListerIterDataPipe",
    "S3FileLoaderIterDataPipe",
]


def _http_options(query_params: Mapping[str, Any]) -> dict[str, Any]:
    """Turn 0.9's ``requests`` keyword arguments into fsspec HTTP storage options."""
    options = dict(query_params)
    auth = options.get("auth")
    if isinstance(auth, tuple):  # requests' (user, password); aiohttp wants BasicAuth
        import aiohttp

        options["auth"] = aiohttp.BasicAuth(*auth)
    return options


def _open_http(url: str, timeout: float | None, query_params: Mapping[str, Any]) -> tuple[str, Any]:
    opener = FSSpecFileOpener(
        [url], "rb", storage_options=_http_options(query_params), timeout=timeout
    )
    return next(iter(opener))


def _skip_or_raise(skip_on_error: bool, exc: Exception) -> None:
    if not skip_on_error:
        raise exc
    warnings.warn(f"{exc}, skipping...", stacklevel=3)


class _UrlReader(StageIterDataPipe[tuple[str, Any]]):
    """Open each URL with :meth:`_open`; warn and skip a failing one under ``skip_on_error``."""

    def __init__(
        self,
        source_datapipe: IterDataPipe[str],
        timeout: float | None = None,
        skip_on_error: bool = False,
        **kwargs: Any,
    ) -> None:
        self.source_datapipe = source_datapipe
        self.timeout = timeout
        self.skip_on_error = skip_on_error
        self.query_params = kwargs

    def _open(self, url: str) -> tuple[str, Any]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for url in self.source_datapipe:
            try:
                pair = self._open(url)
            except Exception as exc:
                _skip_or_raise(self.skip_on_error, exc)
                continue
            yield pair

    def __len__(self) -> int:
        return len(self.source_datapipe)


class _KeywordUrlReader(_UrlReader):
    """A reader whose options after the source are keyword-only (0.9's GDrive and online readers)."""

    def __init__(
        self,
        source_datapipe: IterDataPipe[str],
        *,
        timeout: float | None = None,
        skip_on_error: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(source_datapipe, timeout, skip_on_error, **kwargs)


@register("read_from_http")
class HTTPReaderIterDataPipe(_UrlReader):
    """Open each HTTP(S) URL and yield ``(url, stream)`` (functional name: ``read_from_http``).

    Args:
        source_datapipe: URLs.
        timeout: Seconds a request may take. Default: ``None``.
        skip_on_error: Warn and skip a URL that fails instead of raising. Default: ``False``.
        **kwargs: HTTP options such as ``headers=`` or ``auth=(user, password)``.
    """

    def _open(self, url: str) -> tuple[str, Any]:
        return _open_http(url, self.timeout, self.query_params)


def _gdrive(url: str, timeout: float | None, query_params: Mapping[str, Any]) -> tuple[str, Any]:
    try:
        import requests
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "GDriveReader needs requests: pip install 'shardpipes[http]'"
        ) from exc
    with requests.Session() as session:
        response = session.get(url, timeout=timeout, stream=True, **query_params)
        response.raise_for_status()
        token = next(
            (v for k, v in response.cookies.items() if k.startswith("download_warning")), None
        )
        if token is None:
            match = re.search(r"<title>Google Drive - (?P<api>.+?)</title>", response.text)
            api = match["api"] if match else None
            if api == "Virus scan warning":
                token = "t"
            elif api == "Quota exceeded":
                raise RuntimeError(
                    f"Google drive link {url} is currently unavailable, because the quota was exceeded."
                )
        if token:
            url = f"{url}&confirm={token}"
        response = session.get(url, timeout=timeout, stream=True, **query_params)
        response.raise_for_status()
        disposition = response.headers.get("content-disposition")
        if disposition is None:
            raise RuntimeError(
                f"Google drive link {url} internal error: headers don't contain content-disposition. "
                "Use the link of the Download page, not a sharing/viewing link."
            )
        names = re.findall(r'filename="(.+)"', disposition)
        if not names:
            raise RuntimeError(f"Google drive link {url}: filename could not be autodetected")
    return names[0], StreamWrapper(response.raw)


@register("read_from_gdrive")
class GDriveReaderDataPipe(_KeywordUrlReader):
    """Download each Google Drive link and yield ``(file name, stream)`` (functional name: ``read_from_gdrive``).

    Args:
        source_datapipe: Google Drive download links.
        timeout: Seconds a request may take. Default: ``None``.
        skip_on_error: Warn and skip a link that fails instead of raising. Default: ``False``.
        **kwargs: Passed to ``requests``.
    """

    def _open(self, url: str) -> tuple[str, Any]:
        return _gdrive(url, self.timeout, self.query_params)


@register("read_from_remote")
class OnlineReaderIterDataPipe(_KeywordUrlReader):
    """Open each URL, Google Drive links as ``read_from_gdrive``, others as ``read_from_http`` (functional name: ``read_from_remote``).

    Takes the arguments of ``GDriveReader``.
    """

    def _open(self, url: str) -> tuple[str, Any]:
        if re.match(r"(drive|docs)[.]google[.]com", urllib.parse.urlparse(url).netloc):
            return _gdrive(url, self.timeout, self.query_params)
        return _open_http(url, self.timeout, self.query_params)


def _s3_options(
    request_timeout_ms: int, region: str, extra: Mapping[str, Any] | None
) -> dict[str, Any]:
    options: dict[str, Any] = dict(extra or {})
    if region:
        options.setdefault("client_kwargs", {}).setdefault("region_name", region)
    if request_timeout_ms and request_timeout_ms > 0:
        seconds = request_timeout_ms / 1000
        options.setdefault("config_kwargs", {}).update(
            connect_timeout=seconds, read_timeout=seconds
        )
    return options


@register("list_files_by_s3")
class S3FileListerIterDataPipe(StageIterDataPipe[str]):
    """List the ``s3://`` URLs of every object under each prefix, through s3fs (functional name: ``list_files_by_s3``).

    Args:
        source_datapipe: ``s3://bucket/prefix`` strings; every object whose key starts with the
            prefix is listed, recursively.
        length: Nominal length reported by ``len()``. Default: ``-1`` (none).
        request_timeout_ms: Connect and read time-out. Default: ``-1`` (s3fs's).
        region: AWS region. Default: ``""`` (from the environment).
        masks: Glob pattern(s) the URLs must match. Default: ``""`` (all).
        storage_options: Further s3fs options (endpoint, credentials). Default: ``None``.
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[str],
        length: int = -1,
        request_timeout_ms: int = -1,
        region: str = "",
        masks: str | list[str] = "",
        *,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.source_datapipe = source_datapipe
        self.length = length
        self.masks = masks
        self.storage_options = _s3_options(request_timeout_ms, region, storage_options)

    def __iter__(self) -> Iterator[str]:
        import fsspec

        for prefix in self.source_datapipe:
            if not prefix.startswith("s3://"):
                raise ValueError(f"S3FileLister expects s3:// URLs, got {prefix!r}")
            fs = fsspec.filesystem("s3", **self.storage_options)
            path = prefix[len("s3://") :]
            folder = path.rsplit("/", 1)[0] if "/" in path else path
            for key in sorted(fs.find(folder)):
                url = f"s3://{key}"
                if key.startswith(path) and match_masks(url, self.masks):
                    yield url

    def __len__(self) -> int:
        if self.length == -1:
            raise TypeError(f"{type(self).__name__} instance doesn't have valid length")
        return self.length


@register("load_files_by_s3")
class S3FileLoaderIterDataPipe(StageIterDataPipe[tuple[str, Any]]):
    """Open each ``s3://`` URL through s3fs and yield ``(url, stream)`` (functional name: ``load_files_by_s3``).

    Args:
        source_datapipe: ``s3://bucket/key`` URLs.
        request_timeout_ms: Connect and read time-out. Default: ``-1`` (s3fs's).
        region: AWS region. Default: ``""`` (from the environment).
        buffer_size: Bytes per ranged read. Default: ``None`` (shardpipes' block size).
        multi_part_download: Accepted for compatibility; reads are always ranged.
        storage_options: Further s3fs options (endpoint, credentials). Default: ``None``.
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[str],
        request_timeout_ms: int = -1,
        region: str = "",
        buffer_size: int | None = None,
        multi_part_download: bool | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.source_datapipe = source_datapipe
        self.buffer_size = buffer_size
        self.storage_options = _s3_options(request_timeout_ms, region, storage_options)

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        if self.buffer_size:
            opener = FSSpecFileOpener(
                self.source_datapipe,
                "rb",
                storage_options=self.storage_options,
                block_size=self.buffer_size,
            )
        else:
            opener = FSSpecFileOpener(
                self.source_datapipe, "rb", storage_options=self.storage_options
            )
        yield from opener

    def __len__(self) -> int:
        return len(self.source_datapipe)
