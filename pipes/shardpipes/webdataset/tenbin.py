"""webdataset's ``tenbin`` module (``from webdataset import tenbin``): :mod:`shardpipes.formats.tenbin`."""

from shardpipes.formats.tenbin import decode_buffer, encode_buffer, load, read, save, write

__all__ = ["decode_buffer", "encode_buffer", "load", "read", "save", "write"]
