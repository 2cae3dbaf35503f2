"""Members -> samples: the WebDataset key rule, in one place.

A tar member ``dir/key.ext1.ext2`` belongs to the sample ``dir/key``; its field is
``.ext1.ext2``. Consecutive members with one key form a sample. Three things break the rule,
and each has one error, with one message naming the shard URL and the key: a member without an
extension, a key that comes back after other keys, and a sample with two members of one
extension. The ``webdataset`` stage (which keeps the data) and the index scanner (which keeps
byte spans) both apply it from here.
"""

from __future__ import annotations

from shardpipes.errors import SampleFormatError

__all__ = ["duplicate_field", "key_again", "no_extension", "split_key"]


def split_key(name: str) -> tuple[str, str]:
    """Split a member path into ``(key, extension)`` as the WebDataset format defines them.

    The key is the path up to the first dot of the basename; the extension is the rest, with
    its leading dot: ``"train/x.seg.png"`` -> ``("train/x", ".seg.png")``. A basename with no
    dot gives an empty extension.

    Examples:
        >>> split_key("train/x.seg.png")
        ('train/x', '.seg.png')
        >>> split_key("a.b/c")
        ('a.b/c', '')
    """
    dot = name.find(".", name.rfind("/") + 1)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot:]


def _where(offset: int | None) -> str:
    return f" at byte offset {offset}" if offset is not None else ""


def no_extension(url: str, name: str, offset: int | None = None) -> SampleFormatError:
    """The error for a member ``name`` without an extension."""
    return SampleFormatError(
        f"{url}: member {name!r}{_where(offset)} has no extension "
        "(a sample field needs one, as in 'key.jpg')",
        url=url,
        key=name,
    )


def key_again(url: str, key: str, at: str) -> SampleFormatError:
    """The error for key ``key`` coming back after other keys, ``at`` a member or byte offset."""
    return SampleFormatError(
        f"{url}: key {key!r} appears again at {at} after other keys; the members of a sample "
        "must be adjacent",
        url=url,
        key=key,
    )


def duplicate_field(url: str, key: str, ext: str, offset: int | None = None) -> SampleFormatError:
    """The error for a second ``ext`` member in sample ``key``."""
    return SampleFormatError(
        f"{url}: sample {key!r} has two {ext!r} members"
        + (f" (the second at byte offset {offset})" if offset is not None else ""),
        url=url,
        key=key,
    )
