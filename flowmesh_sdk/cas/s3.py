"""A content-addressable store in an S3-compatible object store, through boto3.

boto3 is imported when an :class:`S3Store` is made, never when this module is imported,
so the core stays free of cloud SDKs (``pip install flowmesh-sdk[s3]``).

Keys under ``prefix``::

    objects/sha256/<hex>       one object per digest
    refs/<name>                framed refs

Create-if-absent is S3's *conditional write*: ``PutObject`` with ``If-None-Match: *``
answers 412 Precondition Failed when the key exists, and S3 decides it atomically
(AWS What's New, 2024-08-20, "Amazon S3 now supports conditional writes",
aws.amazon.com/about-aws/whats-new/2024/08/amazon-s3-conditional-writes/; the S3 User
Guide's "conditional requests" page).  boto3 exposes it as ``IfNoneMatch`` on
``put_object`` (releases after that date; checked with boto3 1.44.8).  moto (5.2.5 here) honours the header too, but
checks and stores in two steps without a lock, so two writers racing on the same key in
the *same instant* can both succeed against moto; the tests race processes on the local
store and check the S3 path's 412 handling one writer after the other.  A store that
ignores the header (some older S3-compatible servers) would let the last writer win; use
the local store, or one that implements conditional writes, for publish-once.

An object PUT also sends ``ChecksumSHA256``, so S3 refuses a body damaged in transit;
what is read back is hashed again before use either way.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .base import (CasCorruptError, CasError, CasNotFoundError, ContentStore, check_object_digest,
                   check_ref_name, frame_ref, unframe_ref, verify_object)
from ..errors import AuthError, FlowMeshError, SpecError
from ..identity import digest_bytes

__all__ = ["S3Store"]


class S3Store(ContentStore):
    """Objects and refs in ``s3://bucket/prefix``.

    ``client`` is a ready boto3 S3 client; otherwise one is made from ``endpoint_url``,
    ``region`` and ``session_kwargs`` (credentials; never logged).  Calls run in a small
    thread pool of this store's own (boto3 clients are thread-safe)."""

    def __init__(self, bucket: str, *, prefix: str = "", client: Any = None,
                 endpoint_url: str | None = None, region: str = "us-east-1",
                 session_kwargs: Mapping[str, str] | None = None, max_workers: int = 8) -> None:
        if not isinstance(bucket, str) or not bucket:
            raise SpecError("s3.bucket", f"must be a bucket name, got {bucket!r}")
        prefix = prefix.strip("/")
        if prefix:
            check_ref_name(prefix)
        self.bucket = bucket
        self.prefix = f"{prefix}/" if prefix else ""
        self.location = f"s3://{bucket}/{self.prefix}"
        if client is None:
            import boto3.session          # lazily: the core never imports a cloud SDK
            import botocore.config

            cfg = botocore.config.Config(s3={"addressing_style": "path"},
                                         retries={"mode": "standard", "max_attempts": 5})
            client = boto3.session.Session(**dict(session_kwargs or {})).client(
                "s3", region_name=region, endpoint_url=endpoint_url, config=cfg)
        self._client = client
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="flowmesh-s3")

    def __repr__(self) -> str:
        return f"S3Store({self.location!r})"

    def object_key(self, digest: str) -> str:
        algo, _, hexpart = check_object_digest(digest).partition(":")
        return f"{self.prefix}objects/{algo}/{hexpart}"

    def ref_key(self, name: str) -> str:
        return f"{self.prefix}refs/{check_ref_name(name)}"

    async def _call(self, fn: Any, /, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(**kwargs))

    @staticmethod
    def _code(exc: BaseException) -> tuple[str, int]:
        resp = getattr(exc, "response", None) or {}
        return (str(resp.get("Error", {}).get("Code", "")),
                int(resp.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0))

    def _wrap(self, exc: BaseException, what: str) -> FlowMeshError:
        code, status = self._code(exc)
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch") or status == 403:
            return AuthError(f"S3 refused {what} in {self.location} ({code or status}): check the "
                             "credentials given to S3Store", provider="s3", code=code)
        return CasError(f"S3 {what} in {self.location} failed: {code or status or type(exc).__name__}")

    async def _get_raw(self, key: str) -> bytes | None:
        try:
            resp = await self._call(self._client.get_object, Bucket=self.bucket, Key=key)
            return await asyncio.get_running_loop().run_in_executor(self._pool, resp["Body"].read)
        except Exception as exc:  # noqa: BLE001 - botocore's ClientError, mapped below
            code, status = self._code(exc)
            if code in ("NoSuchKey", "404") or status == 404:
                return None
            raise self._wrap(exc, f"GET {key}") from exc

    async def _put_raw(self, key: str, body: bytes, *, if_absent: bool) -> bool:
        """PUT; with ``if_absent``, False when the key already existed (412)."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": key, "Body": body,
                                  "ChecksumSHA256": base64.b64encode(hashlib.sha256(body).digest()).decode()}
        if if_absent:
            kwargs["IfNoneMatch"] = "*"
        try:
            await self._call(self._client.put_object, **kwargs)
            return True
        except Exception as exc:  # noqa: BLE001
            code, status = self._code(exc)
            if if_absent and (code in ("PreconditionFailed", "ConditionalRequestConflict")
                              or status in (409, 412)):
                return False
            raise self._wrap(exc, f"PUT {key}") from exc

    # ---- the contract --------------------------------------------------------------
    async def put(self, data: bytes) -> str:
        data = bytes(data)
        digest = digest_bytes(data)
        key = self.object_key(digest)
        if await self._put_raw(key, data, if_absent=True):
            return digest
        existing = await self._get_raw(key)
        try:
            if existing is not None:
                verify_object(digest, existing)
                return digest
        except CasCorruptError:
            pass
        await self._put_raw(key, data, if_absent=False)   # same digest, right bytes: replace
        return digest

    async def get(self, digest: str) -> bytes:
        data = await self._get_raw(self.object_key(digest))
        if data is None:
            raise CasNotFoundError(digest)
        return verify_object(digest, data)

    async def has(self, digest: str) -> bool:
        try:
            await self._call(self._client.head_object, Bucket=self.bucket, Key=self.object_key(digest))
            return True
        except Exception as exc:  # noqa: BLE001
            code, status = self._code(exc)
            if code in ("NoSuchKey", "404", "NotFound") or status == 404:
                return False
            raise self._wrap(exc, f"HEAD {digest}") from exc

    async def create_ref(self, name: str, body: bytes) -> tuple[bool, bytes]:
        key = self.ref_key(name)
        for _ in range(3):
            if await self._put_raw(key, frame_ref(bytes(body)), if_absent=True):
                return True, bytes(body)
            raw = await self._get_raw(key)
            if raw is not None:
                return False, unframe_ref(name, raw)
            # deleted between the 412 and our GET (a concurrent drop_ref): create again
        raise CasError(f"ref {name} in {self.location} keeps appearing and vanishing")

    async def read_ref(self, name: str) -> bytes | None:
        raw = await self._get_raw(self.ref_key(name))
        return None if raw is None else unframe_ref(name, raw)

    async def drop_ref(self, name: str) -> bool:
        key = self.ref_key(name)
        existed = await self._get_raw(key) is not None
        try:
            await self._call(self._client.delete_object, Bucket=self.bucket, Key=key)
        except Exception as exc:  # noqa: BLE001
            raise self._wrap(exc, f"DELETE {key}") from exc
        return existed

    async def list_refs(self, prefix: str) -> list[str]:
        base = f"{self.prefix}refs/"
        names: list[str] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": base + prefix}
            if token:
                kwargs["ContinuationToken"] = token
            try:
                page = await self._call(self._client.list_objects_v2, **kwargs)
            except Exception as exc:  # noqa: BLE001
                raise self._wrap(exc, f"LIST {base + prefix}") from exc
            names += [o["Key"][len(base):] for o in page.get("Contents", ())]
            if not page.get("IsTruncated"):
                return sorted(names)
            token = page.get("NextContinuationToken")

    async def close(self) -> None:
        self._pool.shutdown(wait=False)
