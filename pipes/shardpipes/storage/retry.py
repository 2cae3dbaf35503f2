"""Retry policy, error classification and credential redaction for remote reads.

Used by :mod:`shardpipes.storage.remote` (the resumable stream) and by the fsspec
stages. Backends report the same failure in different ways; :func:`classify_error` sorts them
into what can be retried and what cannot, and :class:`Redactor` makes sure no message, and no
exception chained to one, shows a password, token or signature.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NoReturn
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

# The read errors live in shardpipes.errors; re-exported here, where they were first defined.
from shardpipes.errors import (
    ForbiddenShardError,
    MissingShardError,
    NotAFileError,
    RetriesExhaustedError,
    ShardReadError,
)

__all__ = [
    "ForbiddenShardError",
    "Kind",
    "MissingShardError",
    "NotAFileError",
    "Redactor",
    "RetriesExhaustedError",
    "RetryPolicy",
    "ShortBody",
    "classify_error",
    "redact_url",
    "secrets_of",
]

Kind = Literal["missing", "forbidden", "transient", "fatal"]


class ShortBody(Exception):
    """A response ended before the requested length: the connection was cut."""


# --- retry policy and error classification ------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a read is retried.

    Attributes:
        retries: Retries per failing request after the first attempt (``0``: fail at once).
        backoff: Seconds before the first retry; doubled for each further one.
        max_backoff: Upper bound of one wait.
        timeout: Seconds one request (one block) may take before it counts as failed, or
            ``None`` for no limit.
    """

    retries: int = 5
    backoff: float = 0.5
    max_backoff: float = 30.0
    timeout: float | None = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries should be a non-negative integer, got {self.retries!r}")
        if self.backoff < 0 or self.max_backoff < 0:
            raise ValueError(
                f"backoff ({self.backoff!r}) and max_backoff ({self.max_backoff!r}) should be >= 0"
            )
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError(
                f"timeout should be a positive number of seconds or None, got {self.timeout!r}"
            )

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (0-based)."""
        return float(min(self.backoff * 2**attempt, self.max_backoff))


# errno values that no retry can fix (s3fs maps S3 error codes onto these).
_PERMANENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in ("ENOENT", "EACCES", "EPERM", "EISDIR", "ENOTDIR", "EINVAL", "ENOSYS",
                 "ENAMETOOLONG", "EREMCHG", "EROFS", "EMSGSIZE")
    if hasattr(errno, name)
)  # fmt: skip
# botocore's network-level exceptions (not builtins); its config errors stay fatal.
_BOTO_TRANSIENT = frozenset(
    {
        "HTTPClientError",
        "ConnectionError",
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ConnectionClosedError",
        "IncompleteReadError",
        "ResponseStreamingError",
        "ProxyConnectionError",
    }
)


def _status(exc: BaseException) -> int | None:
    """The HTTP status of a response error: aiohttp, gcsfs ``HttpError``, botocore, requests.

    Only response errors count: aiohttp's parser errors also carry a ``code`` (400) that says
    nothing about the server's answer.
    """
    for cls in type(exc).__mro__:
        mod, name = cls.__module__, cls.__name__
        if mod.startswith("aiohttp") and name == "ClientResponseError":
            value = getattr(exc, "status", None)
            return value if isinstance(value, int) else None
        if mod.startswith("gcsfs") and name == "HttpError":
            value = getattr(exc, "code", None)
            return value if isinstance(value, int) else None
        if mod.startswith("requests") and name == "HTTPError":
            value = getattr(getattr(exc, "response", None), "status_code", None)
            return value if isinstance(value, int) else None
    response = getattr(exc, "response", None)  # botocore ClientError
    if isinstance(response, Mapping):
        code = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(code, int):
            return code
    return None


def _status_kind(status: int) -> Kind | None:
    if status in (401, 403):
        return "forbidden"
    if status in (404, 410):
        return "missing"
    if status >= 500 or status in (408, 425, 429):
        return "transient"
    if status >= 400:
        return "fatal"
    return None


def _transient_type(exc: BaseException) -> bool:
    if isinstance(exc, OSError):  # includes TimeoutError, ConnectionError, requests' errors
        return exc.errno not in _PERMANENT_ERRNOS
    if isinstance(exc, (TimeoutError, EOFError, ShortBody)):
        return True
    for cls in type(exc).__mro__:
        mod = cls.__module__
        if mod.startswith("aiohttp") and cls.__name__ == "ClientError":
            return True  # payload errors, disconnects; statuses were handled before
        if mod.startswith("http.client") and cls.__name__ == "HTTPException":
            return True
        if mod.startswith(("botocore", "aiobotocore")) and cls.__name__ in _BOTO_TRANSIENT:
            return True
    return False


def classify_error(exc: BaseException) -> Kind:
    """Sort a backend's exception into ``missing``, ``forbidden``, ``transient`` or ``fatal``.

    Backends disagree on how they report the same failure: fsspec's HTTP filesystem turns any
    failed ``info`` into ``FileNotFoundError`` with the real error as ``__cause__``; gcsfs
    reports 403 as a plain ``OSError("Forbidden: ...")``; s3fs maps S3 codes onto errno values.
    So statuses anywhere in the cause chain win, then the exception types.
    """
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            break
        status = _status(seen)
        kind = _status_kind(status) if status is not None else None
        if kind is not None:
            return kind
        seen = seen.__cause__
    if isinstance(exc, FileNotFoundError):
        cause = exc.__cause__
        if cause is None or isinstance(cause, FileNotFoundError):
            return "missing"
        # fsspec HTTP's info(): a refused connection or a time-out is worth a retry; anything
        # else (aiohttp refusing the request, say) no retry can fix.
        return "transient" if _transient_type(cause) else "fatal"
    if isinstance(exc, PermissionError):
        return "forbidden"
    if isinstance(exc, OSError) and exc.errno is None and str(exc).startswith("Forbidden"):
        return "forbidden"  # gcsfs
    return "transient" if _transient_type(exc) else "fatal"


# --- never print credentials --------------------------------------------------------------------

_SECRET_WORDS = (
    "secret",
    "token",
    "password",
    "passwd",
    "key",
    "auth",
    "credential",
    "signature",
    "sig",
)


def redact_url(url: str) -> str:
    """Return ``url`` without a password in its authority or secrets in its query string.

    Examples:
        >>> redact_url("https://user:pw@host/a.tar?X-Amz-Signature=abc&part=1")
        'https://user:***@host/a.tar?X-Amz-Signature=***&part=1'
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user, sep, _pw = userinfo.partition(":")
        netloc = f"{user}:***@{host}" if sep else f"{user}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_is_secret_name(k) for k, _ in pairs):
            query = urlencode([(k, "***" if _is_secret_name(k) else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _is_secret_name(name: str) -> bool:
    low = name.lower()
    return any(word in low for word in _SECRET_WORDS)


def secrets_of(url: str, storage_options: Mapping[str, Any] | None) -> list[str]:
    """Strings that must never appear in a message: credential values and the raw URL's secrets."""
    found: list[str] = []

    def walk(obj: Any, secret: bool) -> None:
        if isinstance(obj, Mapping):
            for k, v in obj.items():
                walk(v, secret or (isinstance(k, str) and _is_secret_name(k)))
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v, secret)
        elif secret and isinstance(obj, str) and len(obj) >= 4:
            found.append(obj)

    walk(dict(storage_options or {}), False)
    parts = urlsplit(url) if "://" in url else None
    if parts is not None:
        if parts.password:
            found.append(parts.password)
        found.extend(v for k, v in parse_qsl(parts.query) if _is_secret_name(k) and len(v) >= 4)
    return sorted(set(found), key=len, reverse=True)


class Redactor:
    """Formats exceptions for messages without the URL's or the storage options' secrets."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None) -> None:
        self.raw_url = url
        self.url = redact_url(url)
        self.secrets = secrets_of(url, storage_options)

    def text(self, text: str) -> str:
        """``text`` with the raw URL replaced by the redacted one and secrets by ``***``."""
        if self.raw_url != self.url:
            text = text.replace(self.raw_url, self.url)
        for s in self.secrets:
            text = text.replace(s, "***")
        return text

    def describe(self, exc: BaseException) -> str:
        """``"Type: message"`` of ``exc`` (and of its direct cause), redacted."""

        def one(e: BaseException) -> str:
            return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__

        text = one(exc)
        if exc.__cause__ is not None:
            text += f" (from {one(exc.__cause__)})"
        return self.text(text)

    def leaks(self, exc: BaseException) -> bool:
        """Whether ``exc`` or its causes show a secret (then it is not chained to our error)."""
        seen: BaseException | None = exc
        for _ in range(8):
            if seen is None:
                return False
            text = f"{seen} {seen.args!r}"
            if self.raw_url != self.url and self.raw_url in text:
                return True
            if any(s in text for s in self.secrets):
                return True
            seen = seen.__cause__ or seen.__context__
        return False

    def error(
        self, exc: BaseException, kind: Kind, offset: int | None, attempts: int, spent: float
    ) -> ShardReadError:
        """The :class:`ShardReadError` subclass for ``kind``, naming URL and byte offset."""
        what, url = self.describe(exc), self.url
        at = f" (at byte offset {offset})" if offset is not None else ""
        if kind == "missing":
            msg = f"{url}: no such file or bucket{at}: {what}"
            return MissingShardError(msg, url=url, offset=offset, err=errno.ENOENT)
        if kind == "forbidden":
            msg = f"{url}: access denied{at}: {what}"
            return ForbiddenShardError(msg, url=url, offset=offset, err=errno.EACCES)
        at = f" at byte offset {offset}" if offset is not None else ""
        if kind == "transient":
            msg = f"{url}: read failed{at} after {attempts} attempts over {spent:.1f}s: {what}"
            err = getattr(exc, "errno", None) or errno.EIO
            return RetriesExhaustedError(msg, url=url, offset=offset, err=err)
        return ShardReadError(f"{url}: read failed{at}: {what}", url=url, offset=offset)

    def raise_(
        self, exc: BaseException, kind: Kind, offset: int | None, attempts: int, spent: float
    ) -> NoReturn:
        """Raise :meth:`error`, chained to ``exc`` unless that would print a secret."""
        err = self.error(exc, kind, offset, attempts, spent)
        if self.leaks(exc):
            raise err from None
        raise err from exc
