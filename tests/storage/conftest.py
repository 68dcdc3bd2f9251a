"""A real S3-compatible server (moto in server mode) on 127.0.0.1, one per module, and
the environment that points boto at it with dummy credentials."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.processes import free_port


@dataclass
class S3Server:
    endpoint: str
    env: dict[str, str]

    def new_bucket(self) -> str:
        """A fresh, empty bucket's name."""
        import boto3

        name = f"baton-{uuid.uuid4().hex[:12]}"
        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")
        client.create_bucket(Bucket=name)
        return name


CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    moto_server = pytest.importorskip("moto.server")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in (*CREDENTIALS, "AWS_ENDPOINT_URL")}
    os.environ.update(CREDENTIALS, AWS_ENDPOINT_URL=endpoint)
    try:
        tests = str(Path(__file__).resolve().parents[1])  # recipes import ``support``
        env = {**os.environ, "OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu",
               "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}  # fmt: skip
        yield S3Server(endpoint, env)
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
