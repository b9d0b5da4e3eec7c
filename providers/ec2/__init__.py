"""The ``ec2`` provider: Amazon EC2 through boto3 (the ``ec2`` extra).

Importing this package does not import boto3; the first API call does.  See
:mod:`.provider` for what each contract call does on EC2, :mod:`.client` for the EC2
API throttling limits it declares, :mod:`.errors` for how EC2 error codes map onto the
SDK's errors, and :mod:`.prices` for the catalog's live EC2 price refresh.  The provider
reports shapes; prices come from the catalog (``flowmesh_sdk.catalog``).
"""

from .errors import ERROR_TABLE, map_client_error
from .provider import DEFAULT_INSTANCE_TYPES, Ec2Provider

__all__ = ["DEFAULT_INSTANCE_TYPES", "ERROR_TABLE", "Ec2Provider", "map_client_error"]
