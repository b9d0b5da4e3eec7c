"""A test fixture: moto's S3 in server mode on 127.0.0.1, for :class:`~flowmesh_sdk.cas.s3.S3Store`.

::

    with MotoS3() as moto:
        store = moto.store("results")          # an S3Store on a fresh bucket, dummy keys
        await store.put(b"...")

moto's ``ThreadedMotoServer`` serves every AWS service it emulates on one port, so this
reuses :class:`~flowmesh_sdk.testing.moto.MotoEc2` (which starts it, keeps werkzeug
quiet and hands out dummy credentials that never reach ``os.environ``) and adds S3
helpers.  What moto 5.2.5 does for S3 conditional writes: ``PutObject`` with
``If-None-Match: *`` answers 412 PreconditionFailed when the key exists, but the check
and the store are two steps without a lock (see :mod:`flowmesh_sdk.cas.s3`).
"""

from __future__ import annotations

from typing import Any

from .moto import MotoEc2

__all__ = ["MotoS3"]


class MotoS3(MotoEc2):
    """moto's server on 127.0.0.1 used for S3 (a test fixture)."""

    def __init__(self, *, port: int = 0) -> None:
        super().__init__(port=port, ami_validation=False, instance_type_validation=False)

    def __enter__(self) -> MotoS3:
        self.start()
        return self

    def s3_client(self, region: str = "us-east-1") -> Any:
        """A plain boto3 S3 client (path-style addressing) with the dummy keys."""
        import boto3.session
        import botocore.config

        cfg = botocore.config.Config(s3={"addressing_style": "path"},
                                     retries={"mode": "standard", "total_max_attempts": 1})
        return boto3.session.Session(**self.session_kwargs).client(
            "s3", region_name=region, endpoint_url=self.endpoint_url, config=cfg)

    def create_bucket(self, bucket: str, region: str = "us-east-1") -> str:
        self.s3_client(region).create_bucket(Bucket=bucket)
        return bucket

    def store(self, bucket: str, *, prefix: str = "", create: bool = True) -> Any:
        """An :class:`~flowmesh_sdk.cas.s3.S3Store` on ``bucket`` (created unless told not to)."""
        from ..cas.s3 import S3Store

        if create:
            self.create_bucket(bucket)
        return S3Store(bucket, prefix=prefix, endpoint_url=self.endpoint_url,
                       session_kwargs=self.session_kwargs)
