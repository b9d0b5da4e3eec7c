"""Content-addressable storage: results, trajectories, test outputs, checkpoints and
uploaded inputs, each named by the SHA-256 of its bytes.

``LocalDirStore`` (a directory; the default) is imported here; ``S3Store`` lives in
:mod:`flowmesh_sdk.cas.s3` and imports boto3 only when one is made.
"""

from .base import CasCorruptError, CasError, CasNotFoundError, ContentStore
from .local import LocalDirStore

__all__ = ["CasCorruptError", "CasError", "CasNotFoundError", "ContentStore", "LocalDirStore"]
