"""The ``gce`` provider: Google Compute Engine through google-cloud-compute (the ``gce`` extra).

Importing this package does not import the Google libraries; the first API call does.  See
:mod:`.provider` for what each contract call does, :mod:`.client` for the library facts
and published rate limits, :mod:`.errors` for the error table, and :mod:`.prices` for the
catalog's live price refresh.  The provider reports shapes; prices come from the catalog.
"""

from .errors import ERROR_TABLE
from .provider import DEFAULT_MACHINE_TYPES, GceProvider, SshMode

__all__ = ["DEFAULT_MACHINE_TYPES", "ERROR_TABLE", "GceProvider", "SshMode"]
