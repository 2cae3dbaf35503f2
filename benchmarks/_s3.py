"""Loopback S3 for the benchmark: moto's ``ThreadedMotoServer`` on 127.0.0.1 with the shards in it.

The server runs in the benchmark's own process (threads), so it competes for the same 2 cores
as the loader it serves, as a local object store would. Children reach it through the standard
AWS variables (``AWS_ENDPOINT_URL`` and dummy credentials), which s3fs (through botocore)
honours without any code change in the peers.

Transports per peer:

- ``s3cat`` (the limit of this transport): plain s3fs, each object opened and read
  sequentially in 1 MiB reads.
- ``shardpipes`` and ``torchdata09``: ``open_files_by_fsspec`` on ``s3://`` URLs (s3fs).
- ``webdataset``: 1.0.2 has no ``s3://`` handler (its docs pipe through ``aws s3 cp``, not
  installed here), so the runner registers fsspec's opener in ``webdataset.gopen.gopen_schemes``:
  the same s3fs transport as the others.
- ``wids`` copies every shard to a local cache before reading, so over S3 it would measure a
  download; it is not run.
"""

from __future__ import annotations

import os

__all__ = ["S3_PEERS", "LoopbackS3"]

BUCKET = "shardpipes-bench"
S3_PEERS = ["s3cat", "webdataset", "torchdata09", "torchdata09_dl", "shardpipes"]


class LoopbackS3:
    """Start moto on 127.0.0.1 (port 0), upload datasets, give the children's environment."""

    def __init__(self) -> None:
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request on stderr

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        import boto3

        self._client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        self._client.create_bucket(Bucket=BUCKET)

    def upload(self, manifest: dict) -> dict:
        """Copy the shards of ``manifest`` into the bucket; return a manifest of S3 URLs."""
        prefix = os.path.basename(manifest["directory"])
        s3 = []
        for path in manifest["paths"]:
            key = f"{prefix}/{os.path.basename(path)}"
            self._client.upload_file(path, BUCKET, key)
            s3.append(f"s3://{BUCKET}/{key}")
        return {**manifest, "paths": s3, "transport": "s3"}

    def stop(self) -> None:
        self._server.stop()
