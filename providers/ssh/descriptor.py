"""What the core knows of ``ssh``, the user's own machines (see
:mod:`flowmesh_sdk.descriptor`): free, not in the price catalog, no API to rate-limit."""

from flowmesh_sdk.descriptor import ProviderDescriptor, Setting

DESCRIPTOR = ProviderDescriptor(
    name="ssh",
    provider="flowmesh_providers.ssh.provider:SshProvider",
    settings=(Setting("providers.ssh.inventory", ("FLOWMESH_SSH_INVENTORY",),
                      help="the ssh provider's inventory (JSON)"),),
    emulator="flowmesh_sdk.testing.sshd:LoopbackSshd",
    conformance="flowmesh_providers.ssh.conformance:environment",
)
