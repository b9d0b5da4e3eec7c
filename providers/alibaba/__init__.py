"""The ``alibaba`` provider: Alibaba Cloud ECS through ``alibabacloud-ecs20140526`` (the
``alibaba`` extra).

Importing this package does not import the ECS SDK; the first API call does.  See
:mod:`.provider` for what each contract call does, :mod:`.client` for the SDK facts,
credentials and published limits, :mod:`.errors` for the error table, and :mod:`.prices`
for the catalog's live price refresh (``DescribePrice``).  The provider reports shapes;
prices come from the catalog.
"""

from .errors import ERROR_TABLE, map_error
from .provider import DEFAULT_INSTANCE_TYPES, AlibabaProvider, SshMode

__all__ = ["AlibabaProvider", "DEFAULT_INSTANCE_TYPES", "ERROR_TABLE", "SshMode", "map_error"]
