"""The ``vast`` provider: Vast.ai's GPU marketplace through the ``vastai`` SDK (the ``vast``
extra; ``vastai-sdk`` is a deprecated shim of it).

Importing this package does not import ``vastai``; the first API call does.  See
:mod:`.provider` for what each contract call does (instances are containers:
``nested_containers=False``), :mod:`.client` for the library facts and the assumed rate
limits, :mod:`.errors` for the error mapping, and :mod:`.prices` for the catalog's live
offer refresh.
"""

from .provider import DEFAULT_IMAGE, SshMode, VastProvider

__all__ = ["DEFAULT_IMAGE", "SshMode", "VastProvider"]
