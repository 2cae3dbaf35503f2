"""webdataset's ``pipe:`` URLs: the common download commands read by our own reader.

webdataset runs the text after ``pipe:`` in a shell and reads its standard output. Configs are
full of them: ``pipe:aws s3 cp s3://bucket/x.tar -``, ``pipe:gsutil cat gs://...``,
``pipe:gcloud storage cat gs://...``, ``pipe:curl -s -L https://...``, ``pipe:cat /data/x.tar``.
Each of those only copies one URL to standard output, so it is parsed here into that URL and
read through ``storage/`` like any other (retries that resume at the byte reached, read-ahead,
byte ranges, credentials from ``storage_options``), with no subprocess.

Any other command runs only when the user opts in, with ``SHARDPIPES_PIPE_COMMANDS=1`` in the
environment (worker processes inherit it): a shard URL is data, often from a config file or a
shard list written by someone else, and running it as shell text by default would let whoever
writes the list run any program on every training node. A command that fails raises
:class:`~shardpipes.errors.ShardReadError` naming the command, its exit status and the end of
its standard error.
"""

from __future__ import annotations

import io
import os
import shlex
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import IO, Any, cast

from shardpipes.errors import ShardReadError

__all__ = ["ENV_ALLOW", "PipeSource", "open_command", "parse_pipe_url", "resolve_pipe_url"]

#: The environment variable that lets ``pipe:`` URLs run commands other than the common ones.
ENV_ALLOW = "SHARDPIPES_PIPE_COMMANDS"

# Flags of the common commands that change nothing about the bytes read: skipped when parsing.
_AWS_FLAGS = {"--quiet", "--only-show-errors", "--no-progress"}
_AWS_VALUE_FLAGS = {"--region", "--endpoint-url", "--profile"}
_CURL_FLAGS = {
    "-s",
    "--silent",
    "-S",
    "--show-error",
    "-L",
    "--location",
    "-f",
    "--fail",
    "-sL",
    "-Ls",
    "-sSL",
    "-fsSL",
    "-sS",
    "-fsL",
    "-sf",
    "-fs",
    "--compressed",
}
_CURL_VALUE_FLAGS = {"--retry", "--retry-delay", "--connect-timeout", "--max-time", "-m"}


@dataclass(frozen=True)
class PipeSource:
    """What a ``pipe:`` URL reads: a URL (with storage options) or, opted in, a command."""

    url: str | None
    storage_options: dict[str, Any] = field(default_factory=dict)
    command: str | None = None


def _aws(args: list[str]) -> PipeSource | None:
    # aws [--flags] s3 cp [--flags] s3://bucket/key -
    opts: dict[str, Any] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in _AWS_FLAGS:
            i += 1
        elif a == "--no-sign-request":
            opts["anon"] = True
            i += 1
        elif a in _AWS_VALUE_FLAGS and i + 1 < len(args):
            if a == "--endpoint-url":
                opts["client_kwargs"] = {"endpoint_url": args[i + 1]}
            elif a == "--region":
                opts.setdefault("client_kwargs", {})["region_name"] = args[i + 1]
            elif a == "--profile":
                opts["profile"] = args[i + 1]
            i += 2
        else:
            rest.append(a)
            i += 1
    if (
        len(rest) == 4
        and rest[:2] == ["s3", "cp"]
        and rest[2].startswith("s3://")
        and rest[3] == "-"
    ):
        return PipeSource(rest[2], opts)
    return None


def _gs_cat(args: list[str]) -> PipeSource | None:
    # gsutil [-q] cat gs://...   |   gcloud storage cat gs://...
    args = [a for a in args if a not in ("-q", "--quiet")]
    if len(args) == 2 and args[0] == "cat" and args[1].startswith("gs://"):
        return PipeSource(args[1])
    return None


def _curl(args: list[str]) -> PipeSource | None:
    urls: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in _CURL_FLAGS:
            i += 1
        elif a in _CURL_VALUE_FLAGS and i + 1 < len(args):
            i += 2
        elif a.startswith(("http://", "https://")):
            urls.append(a)
            i += 1
        else:
            return None  # an option that may change the bytes (a header, a range, -o ...)
    return PipeSource(urls[0]) if len(urls) == 1 else None


def _cat(args: list[str]) -> PipeSource | None:
    return PipeSource(args[0]) if len(args) == 1 and not args[0].startswith("-") else None


def parse_pipe_url(url: str) -> PipeSource | None:
    """The URL a ``pipe:`` URL's command copies to its output, or ``None`` if it is not a common one.

    Examples:
        >>> parse_pipe_url("pipe:aws s3 cp --quiet s3://b/train-000.tar -").url
        's3://b/train-000.tar'
        >>> parse_pipe_url("pipe:curl -s -L https://host/a.tar").url
        'https://host/a.tar'
        >>> parse_pipe_url("pipe:gcloud storage cat gs://b/a.tar").url
        'gs://b/a.tar'
        >>> parse_pipe_url("pipe:curl -s https://host/a.tar | gunzip") is None
        True
    """
    if not url.startswith("pipe:"):
        raise ValueError(f"{url!r} is not a pipe: URL")
    text = url[len("pipe:") :].strip()
    try:
        argv = shlex.split(text)
    except ValueError:
        return None
    if not argv or any(tok in ("|", "||", "&&", ";", ">", "<", "&") for tok in argv):
        return None
    cmd, args = os.path.basename(argv[0]), argv[1:]
    if cmd == "aws":
        return _aws(args)
    if cmd == "gsutil":
        return _gs_cat(args)
    if cmd == "gcloud" and args[:1] == ["storage"]:
        return _gs_cat(args[1:])
    if cmd == "curl":
        return _curl(args)
    if cmd == "cat":
        return _cat(args)
    return None


def resolve_pipe_url(url: str) -> PipeSource:
    """What to read for ``url`` (a ``pipe:`` URL): its URL, or its command if the user opted in.

    Raises:
        ShardReadError: The command is not one of the common forms and running commands was
            not allowed (``SHARDPIPES_PIPE_COMMANDS=1``).
    """
    parsed = parse_pipe_url(url)
    if parsed is not None:
        return parsed
    if os.environ.get(ENV_ALLOW, "") not in ("", "0"):
        return PipeSource(None, command=url[len("pipe:") :].strip())
    raise ShardReadError(
        f"{url}: shardpipes reads the common pipe: commands itself (aws s3 cp URL -, gsutil cat "
        "URL, gcloud storage cat URL, curl ... URL, cat PATH) and does not run other shell text "
        f"from a shard URL unless you allow it: set {ENV_ALLOW}=1 to run it, or give the URL "
        "it reads",
        url=url,
    )


class _CommandStream(io.RawIOBase):
    """A command's standard output; at its end, a non-zero exit status raises."""

    def __init__(self, url: str, command: str) -> None:
        self.url = url
        self.command = command
        # A file, not a pipe: a full stderr pipe would block the command. Closed in close().
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self._proc = subprocess.Popen(
            command, shell=True, stdout=subprocess.PIPE, stderr=self._stderr
        )
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        stdout = cast(IO[bytes], self._proc.stdout)  # Popen(stdout=PIPE): never None
        n = stdout.readinto(buffer)  # type: ignore[attr-defined]
        if n == 0 and not self._done:
            self._done = True
            status = self._proc.wait()
            if status != 0:
                self._stderr.seek(0)
                tail = self._stderr.read()[-2000:].decode("utf-8", "replace").strip()
                raise ShardReadError(
                    f"{self.url}: command {self.command!r} exited with status {status}: "
                    f"{tail or '(no standard error)'}",
                    url=self.url,
                )
        return int(n or 0)

    def close(self) -> None:
        if not self.closed:
            if self._proc.poll() is None:  # stopped early: the rest is not wanted
                self._proc.kill()
            self._proc.wait()
            if self._proc.stdout is not None:
                self._proc.stdout.close()
            self._stderr.close()
        super().close()


def open_command(url: str, command: str, mode: str = "rb") -> IO[Any]:
    """Run ``command`` (opted in) and read its standard output, in ``mode`` ``"rb"`` or ``"r"``."""
    raw = _CommandStream(url, command)
    buffered = io.BufferedReader(raw, 1 << 20)
    return buffered if "b" in mode else io.TextIOWrapper(buffered)
