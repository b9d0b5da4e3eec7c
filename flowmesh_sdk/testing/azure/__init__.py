"""A TEST FIXTURE emulating Azure Resource Manager (compute, network, resources) on
127.0.0.1, for the ``azure`` provider and for users' own offline tests.  It is not Azure: it
answers exactly the calls the provider makes, in ARM's JSON shapes, and the real
``azure-mgmt-*`` clients are pointed at it::

    with AzureEmulator() as az:
        provider = az.provider(ssh=True)    # AzureProvider(base_url=az.url, a static test token)
        ...

Calls (``api-version`` required on each, as ARM does): ``PUT .../resourcegroups/RG``;
``GET /subscriptions/S/providers/Microsoft.Compute/skus?$filter=location eq 'L'``;
``PUT``/``GET .../Microsoft.Network/virtualNetworks/V``; ``GET .../networkInterfaces/N``;
``PUT``/``GET``/``DELETE .../Microsoft.Compute/virtualMachines/NAME`` and ``GET`` of the
resource group's VM list.  For ``az`` (Microsoft's CLI) too: ``GET /metadata/endpoints`` and
the VM image alias document (:mod:`.metadata`), an AD FS-style token authority at ``/adfs``
(:mod:`.identity`), subscriptions and tenants, resource group list and DELETE (taking what
is in the group), the subscription's VM list, virtual network and NIC lists, ``PUT`` of a
NIC, a VM's ``$expand=instanceView``, Marketplace image versions (:mod:`.images`) and
template deployments (:mod:`.deployments`, which ``az vm create`` sends).
``AzureEmulator(tls=True)`` serves HTTPS with a self-signed certificate
(:attr:`AzureEmulator.ca_cert`), which az needs (docs/providers/azure.md, "Checked by
``az``").  PUT and DELETE are long-running: ``201``/``202`` with an
``Azure-AsyncOperation`` URL (no ``Retry-After``) whose status goes ``InProgress`` ->
``Succeeded`` | ``Failed`` (with ``error``); a VM PUT of an existing name updates it (ARM's
idempotent PUT).  The bearer token must be :attr:`AzureEmulator.token`
(:class:`StaticTokenCredential` presents it); another subscription answers 404
``SubscriptionNotFound``.

A created VM can be a real machine: :meth:`address` (the provider's
``SshMode(address_map=...)`` hook) boots it, once, from its ``customData`` (the
``#cloud-config`` cloud-init would read) as a loopback sshd host; deleting it stops that
sshd.  Switchable per test: :meth:`exhaust` (VM creations fail with ``AllocationFailed``
in the operation, or ``SkuNotAvailable`` at once), :meth:`set_core_quota`
(``OperationNotAllowed`` ... exceeding approved ... Cores quota), :meth:`fail` (an HTTP
error for a call, e.g. 429 ``TooManyRequests``), :meth:`slow_operations`,
:meth:`delete_behind` and :meth:`deny` (403 ``AuthorizationFailed``).
"""

from .credential import StaticTokenCredential
from .emulator import DEFAULT_SIZES, SUBSCRIPTION, AzureEmulator

__all__ = ["AzureEmulator", "StaticTokenCredential", "DEFAULT_SIZES", "SUBSCRIPTION"]
