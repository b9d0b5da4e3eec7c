"""A TEST FIXTURE emulating the Compute Engine REST API (v1) on 127.0.0.1, for the ``gce``
provider and for users' own offline tests.  It is not Compute Engine: it answers exactly the
calls the provider makes, in the real JSON shapes (int64 fields as strings, ``Operation``
resources, ``{"error": {"code", "message", "errors": [{"reason", ...}]}}`` bodies), and the
real ``google-cloud-compute`` client is pointed at it::

    with GceEmulator() as gce:
        provider = gce.provider(ssh=True)      # GceProvider(endpoint=gce.url, AnonymousCredentials)
        ...

Calls: ``GET .../zones`` and ``.../zones/Z``; ``GET .../zones/Z/machineTypes``,
``.../zones/Z/machineTypes/NAME`` and ``.../aggregated/machineTypes``; ``POST .../zones/Z/instances/bulkInsert``
(``count``, ``minCount``, ``namePattern``, ``instanceProperties``; ``requestId``
idempotent) and ``POST .../zones/Z/instances`` (one Instance resource); ``GET
projects/P`` (``projects.get``: its common metadata and ``CPUS`` quotas); ``GET
.../global/images/family/F`` and ``.../global/images/NAME`` of any project (records of its
own: ``<family>-v20261201``); ``GET .../zones/Z/instances`` and ``GET .../aggregated/instances`` with
``filter`` (``(labels.k = "v") AND ...``, ``(id = N) OR ...``, ``labels.k:*``),
``maxResults`` and ``pageToken``; ``GET``/``DELETE .../zones/Z/instances/NAME``;
``GET .../zones/Z/operations`` (``filter=operationGroupId=ID``, paged), ``GET
.../zones/Z/operations/OP`` and ``POST .../operations/OP/wait`` (held until done or
``wait_hold_s``); ``POST /batch/compute/v1`` (``multipart/mixed``: each part served here);
operations keep the times they were stamped with, and a bulkInsert's has
an ``operationGroupId``.  A bulkInsert names its instances by ``namePattern``, by the keys
of ``perInstanceProperties``, or both; a bad body is a 400 naming the field.  Any call not
served is a 404 with Google's JSON error body.  Another project answers 404 ``The resource 'projects/X' was not found``;
labels are validated as Compute Engine does (lowercase letters, digits, ``_`` and ``-``,
keys starting with a letter, 63 characters), so an unencoded SDK tag fails here too.

An instance reports what a real VM does: its ``disks`` as attached disks with a ``source``
(not the ``initializeParams`` it was made from), ``serviceAccounts``, ``canIpForward`` and
``deletionProtection`` as given, and a ``fingerprint``, ``labelFingerprint`` and
``cpuPlatform``.

Every created instance can be a real machine: :meth:`address` (the provider's
``SshMode(address_map=...)`` hook) boots it, once, from its ``user-data`` metadata (the
``#cloud-config`` cloud-init would read) as a loopback sshd host
(:class:`~flowmesh_sdk.testing.cloudinit.CloudInitHosts`); deleting it stops that sshd.

Switchable per test: :meth:`exhaust` (bulkInsert operations end in
``ZONE_RESOURCE_POOL_EXHAUSTED``), :meth:`set_cpu_quota` (``QUOTA_EXCEEDED``, with its
region), :meth:`fail` (an HTTP error with a reason, e.g. 403 ``rateLimitExceeded``),
:meth:`slow_operations` (operations done after N seconds, or never), :meth:`delete_behind`
(an instance deleted behind the SDK's back) and :meth:`deny` (403 on every call).
Sources for the shapes: the Compute Engine API reference (instances, zoneOperations,
machineTypes) and "Troubleshooting bulk VM creation"
(cloud.google.com/compute/docs/troubleshooting/troubleshooting-bulk-vm-creation).
"""

from .emulator import DEFAULT_MACHINE_TYPES, GceEmulator

__all__ = ["GceEmulator", "DEFAULT_MACHINE_TYPES"]
