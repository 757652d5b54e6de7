"""An S3-protocol server on 127.0.0.1 (moto in server mode, as Ray's own tests use, serving S3
alone) and the environment that points pyarrow, fsspec and boto3 at it."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@dataclass
class LoopbackS3:
    endpoint: str  # http://127.0.0.1:PORT
    env: dict[str, str]  # what a process (or a Ray runtime_env) needs to reach it

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return f"s3://{name}"

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        )
        return [item["Key"] for page in pages for item in page.get("Contents", [])]


@contextlib.contextmanager
def loopback_s3() -> Iterator[LoopbackS3]:
    """Start the server on a free loopback port, set the environment in this process, stop
    both afterwards."""
    from moto.moto_server.werkzeug_app import create_backend_app
    from werkzeug.serving import make_server

    # werkzeug logs every request at INFO on stderr: thousands of lines per run, and CPU.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    # moto's S3 app alone, not ThreadedMotoServer: its dispatcher works out each request's
    # service anew (it lists moto's package directory, stats each of ~200 entries and tries
    # every AWS service's URL patterns), which took half the test process's CPU per request
    # (1,200 requests: 6.5 -> 3.6 s). A run that checkpoints to the bucket makes thousands:
    # each file is a multipart upload of three requests, plus heads and lists.
    # (make_server as ThreadedMotoServer calls it in every moto release the floors allow.)
    server = make_server("127.0.0.1", 0, create_backend_app("s3"), threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="loopback-s3", daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    endpoint = f"http://{host}:{port}"
    env = {**S3_ENV, "AWS_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": endpoint}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield LoopbackS3(endpoint, env)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.shutdown()
        thread.join()
