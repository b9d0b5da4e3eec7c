"""The ``azure`` provider: Azure VMs through azure-mgmt-compute/-network/-resource and
azure-identity (the ``azure`` extra).

Importing this package does not import the Azure libraries; the first API call does.  See
:mod:`.provider` for what each contract call does, :mod:`.client` for the library facts and
published rate limits, :mod:`.errors` for the error table, and :mod:`.prices` for the
catalog's live price refresh.  The provider reports shapes; prices come from the catalog.
"""

from .errors import ERROR_TABLE
from .provider import DEFAULT_VM_SIZES, AzureProvider, SshMode

__all__ = ["AzureProvider", "DEFAULT_VM_SIZES", "ERROR_TABLE", "SshMode"]
