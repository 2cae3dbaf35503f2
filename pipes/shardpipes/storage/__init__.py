"""Storage: URLs, opening through fsspec, retries, remote read-ahead streams, byte ranges."""
