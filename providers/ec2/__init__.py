"""The ``ec2`` provider: Amazon EC2 through boto3 (the ``ec2`` extra).

Importing this package does not import boto3; the first API call does.  See
:mod:`.provider` for what each contract call does on EC2, :mod:`.client` for the EC2
API throttling limits it declares, :mod:`.errors` for how EC2 error codes map onto the
SDK's errors, and :mod:`.prices` for the shipped price snapshot.
"""

from .errors import ERROR_TABLE, map_client_error
from .prices import PriceRow, PriceTable
from .provider import Ec2Provider

__all__ = ["ERROR_TABLE", "Ec2Provider", "PriceRow", "PriceTable", "map_client_error"]
