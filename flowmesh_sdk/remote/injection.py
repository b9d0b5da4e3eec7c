"""SSH mode for cloud providers: keys injected at launch, host keys pinned, never trusted on
first use.  One module that every cloud driver (ec2, gce, azure, ...) shares; it knows
nothing of any cloud (a driver says how its cloud carries user-data and where an instance
listens).

At launch (:meth:`KeyInjector.user_data`) a fresh ed25519 host key pair is made for the
request and rendered, with the fleet's client key (:class:`~flowmesh_sdk.remote.keys.FleetKey`,
kept in ``$FLOWMESH_HOME/keys``), as ``#cloud-config`` user-data
(:mod:`flowmesh_sdk.remote.cloudinit`); the driver hands it to its cloud (EC2
``UserData``, GCE metadata ``user-data``, Azure ``customData``).  The public host key is
pinned per instance in the trust record (``<provider>:<instance-id>`` in
``$FLOWMESH_HOME/keys/known_hosts``, :meth:`KeyInjector.pin`), so another process on this
machine reaches the same instances.  A launch retried with the same request id recovers the
keys of instances it did not launch itself (:meth:`KeyInjector.recover`): from the trust
record, else from the user-data the cloud holds for them (the driver fetches it; parsed,
never logged).  :meth:`KeyInjector.runner` makes an
:class:`~flowmesh_sdk.remote.ssh.SshRunner` that logs in with the fleet key and accepts
exactly the injected host key; an instance with no known injected key gets
:class:`~flowmesh_sdk.errors.AuthError` (``NoHostKey``), never a connection.

What is exposed: the user-data carries the instance's *private host* key (never the fleet's
client private key).  Whoever may read the instance's user-data through the cloud API, and
any process on the instance that reaches the metadata service, can read it; each driver's
docs say how it limits the second (EC2: IMDSv2 hop limit 1; GCE and Azure: sandboxes have
no network by default and the metadata address is blocked when they do).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol, TypeVar

from ..errors import AuthError, ProviderError, SpecError
from .cloudinit import CloudConfig, parse_user_data
from .keys import KNOWN_HOSTS_NAME, FleetKey, KnownHosts, PublicKey, generate_ed25519, keys_dir

if TYPE_CHECKING:
    from .runner import Runner

log = logging.getLogger("flowmesh.remote.injection")


class InstanceLike(Protocol):
    """What SSH mode reads of an instance (:class:`flowmesh_sdk.provider.Instance` has it):
    typed here so that this package needs nothing of ``flowmesh_sdk.provider``."""

    @property
    def id(self) -> str: ...

    @property
    def address(self) -> str | None: ...


#: an instance type of a provider (its ``Instance``), as the callbacks that take one see it
I = TypeVar("I", bound=InstanceLike)

AddressMap = Callable[[InstanceLike], "tuple[str, int]"]
UserDataFetch = Callable[[str], Awaitable["str | bytes | None"]]

__all__ = ["AddressMap", "InstanceLike", "KeyInjector", "SshMode", "instance_runner", "ssh_address"]


@dataclass(frozen=True, slots=True)
class SshMode:
    """How a cloud provider reaches its instances over SSH, with keys injected at launch.

    ``user`` logs in (root by default: the runtime runs containers as root); ``port`` is
    sshd's; ``address`` picks the instance's ``private`` IP (the coordinator runs in the
    same network) or its ``public`` one; ``keys_dir`` holds the fleet key and the trust
    record (default ``$FLOWMESH_HOME/keys``); ``imds_hop_limit`` is EC2's IMDSv2 PUT
    response hop limit (1: containers cannot reach the metadata service; other clouds have
    no such setting and ignore it).  ``address_map`` replaces the address lookup with
    ``Instance -> (host, port)``: a test hook that points instances at loopback sshd hosts
    (``flowmesh_sdk.testing``).  A driver may subclass it to name its fields in errors
    (``field_prefix``)."""

    field_prefix: ClassVar[str] = "ssh"

    user: str = "root"
    port: int = 22
    address: str = "private"
    keys_dir: str | None = None
    connect_timeout_s: float = 10.0
    max_sessions: int = 10
    imds_hop_limit: int = 1
    address_map: AddressMap | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        p = self.field_prefix
        if not isinstance(self.user, str) or not re.match(r"^[a-z_][a-z0-9_-]{0,31}$", self.user):
            raise SpecError(f"{p}.user", f"must be a login name like 'root' or 'ubuntu', got {self.user!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 1 <= self.port <= 65535:
            raise SpecError(f"{p}.port", f"must be an integer in [1, 65535], got {self.port!r}")
        if self.address not in ("private", "public"):
            raise SpecError(f"{p}.address", f"must be 'private' or 'public', got {self.address!r}")
        if not isinstance(self.connect_timeout_s, (int, float)) or not 0 < self.connect_timeout_s <= 600:
            raise SpecError(f"{p}.connect_timeout_s",
                            f"must be in (0, 600] seconds, got {self.connect_timeout_s!r}")
        if isinstance(self.max_sessions, bool) or not isinstance(self.max_sessions, int) or \
                not 1 <= self.max_sessions <= 1024:
            raise SpecError(f"{p}.max_sessions", f"must be an integer in [1, 1024], got {self.max_sessions!r}")
        # HttpPutResponseHopLimit: integers from 1 to 64 (EC2 API reference,
        # InstanceMetadataOptionsRequest).
        if isinstance(self.imds_hop_limit, bool) or not isinstance(self.imds_hop_limit, int) or \
                not 1 <= self.imds_hop_limit <= 64:
            raise SpecError(f"{p}.imds_hop_limit", f"must be an integer in [1, 64], got {self.imds_hop_limit!r}")
        if self.address_map is not None and not callable(self.address_map):
            raise SpecError(f"{p}.address_map", "must be a callable Instance -> (host, port)")

    @classmethod
    def coerce(cls, value: object, field_name: str) -> SshMode | None:
        """``True`` -> the defaults, ``False``/``None`` -> no SSH mode, an SshMode as it is."""
        if value is True:
            return cls()
        if value is False or value is None:
            return None
        if not isinstance(value, SshMode):
            raise SpecError(field_name, f"must be an SshMode (or True), got {type(value).__name__}")
        return value


class KeyInjector:
    """The SSH-mode state of one provider object: the fleet key, the injected host keys
    by instance id, the trust record, and one cached runner per instance."""

    def __init__(self, provider: str, mode: SshMode) -> None:
        self.provider = provider
        self.mode = mode
        self._keys_dir = Path(mode.keys_dir) if mode.keys_dir else None
        self._fleet_key: FleetKey | None = None
        self._host_keys: dict[str, PublicKey] = {}
        self._runners: dict[str, Runner] = {}

    def __repr__(self) -> str:
        return f"KeyInjector({self.provider}, {len(self._host_keys)} host keys)"

    def trust_id(self, instance_id: str) -> str:
        """How an instance's injected host key is named in the trust record."""
        return f"{self.provider}:{instance_id}"

    def trust(self) -> KnownHosts:
        return KnownHosts((self._keys_dir or keys_dir()) / KNOWN_HOSTS_NAME)

    async def fleet(self) -> FleetKey:
        if self._fleet_key is None:
            self._fleet_key = await asyncio.to_thread(FleetKey.load_or_create, self._keys_dir)
        return self._fleet_key

    async def user_data(self, request_id: str) -> tuple[str, PublicKey]:
        """A new host key pair for one launch request: (the ``#cloud-config`` text that
        installs it and authorizes the fleet key, the public host key to pin)."""
        fleet = await self.fleet()
        pair = generate_ed25519(f"flowmesh-host-{request_id}"[:64])
        text = CloudConfig(pair, (fleet.public,), self.mode.user).render()
        return text, pair.public   # the private host key lives on only in the text (and the VM)

    def host_key(self, instance_id: str) -> PublicKey | None:
        return self._host_keys.get(instance_id)

    async def pin(self, instance_ids: Sequence[str], key: PublicKey) -> None:
        """The instances of one launch all carry ``key``."""
        if not instance_ids:
            return
        for iid in instance_ids:
            self._host_keys[iid] = key
        await asyncio.to_thread(self.trust().pin_many, [(self.trust_id(i), key) for i in instance_ids])

    async def recover(self, instance_ids: Iterable[str], fetch_user_data: UserDataFetch | None) -> None:
        """Host keys of instances an earlier call (maybe another process) launched: from the
        trust record, else from the user-data the cloud holds (``fetch_user_data(id)``;
        parsed, never logged).  Instances whose user-data is not the SDK's keep no key,
        and so get no runner."""
        trust = self.trust()
        for iid in instance_ids:
            if iid in self._host_keys:
                continue
            key = await asyncio.to_thread(trust.get, self.trust_id(iid))
            if key is None and fetch_user_data is not None:
                raw = await fetch_user_data(iid)
                try:
                    key = parse_user_data(raw or "").host_public
                except (SpecError, ValueError):
                    log.warning("%s %s: its user-data carries no host key of this SDK; it gets no SSH runner",
                                self.provider, iid)
                    continue
                await asyncio.to_thread(trust.pin, self.trust_id(iid), key)
            if key is not None:
                self._host_keys[iid] = key

    async def forget(self, instance_ids: Sequence[str]) -> None:
        """The instances are gone: drop their keys and close their runners."""
        for iid in instance_ids:
            self._host_keys.pop(iid, None)
            runner = self._runners.pop(iid, None)
            if runner is not None:
                await runner.close()
        if instance_ids:
            await asyncio.to_thread(self.trust().forget, [self.trust_id(i) for i in instance_ids])

    def runner(self, instance: I, address: Callable[[I], tuple[str | None, int]]) -> Runner:
        """The instance's SSH runner (made once): the host from ``mode.address_map`` when set,
        else ``address(instance)``; exactly the injected host key accepted."""
        runner = self._runners.get(instance.id)
        if runner is not None:
            return runner
        key = self._host_keys.get(instance.id)
        if key is None:
            # not launched by this object: the trust record (a small local file) may know it
            key = self.trust().get(self.trust_id(instance.id))
        if key is None:
            raise AuthError(f"{self.provider} instance {instance.id}: no injected host key is known for it (was "
                            "it launched in SSH mode by this SDK?); refusing to connect: cloud instances are "
                            "never trusted on first use", provider=self.provider, code="NoHostKey")
        mode = self.mode
        host: str | None
        if mode.address_map is not None:
            host, port = mode.address_map(instance)
        else:
            host, port = address(instance)
        if not host:
            raise ProviderError(f"{self.provider} instance {instance.id} has no {mode.address} IP address yet",
                                provider=self.provider, code="NoAddress")
        fleet = self._fleet_key
        if fleet is None:   # a runner before any launch in this process: load the key once
            fleet = self._fleet_key = FleetKey.load_or_create(self._keys_dir)
        from .ssh import SshRunner, SshTarget   # fabric is the [ssh] extra
        runner = SshRunner(SshTarget(host, port, mode.user, fleet.private_path, key.line),
                           connect_timeout_s=mode.connect_timeout_s, max_sessions=mode.max_sessions)
        self._runners[instance.id] = runner
        return runner

    async def close(self) -> None:
        runners, self._runners = list(self._runners.values()), {}
        for runner in runners:
            await runner.close()


def ssh_address(mode: SshMode, ips: Mapping[str, tuple[str | None, str | None]],
                instance: InstanceLike) -> tuple[str | None, int]:
    """Where an instance's sshd listens in SSH mode: its private or public IP (``ips`` maps
    an instance id to ``(private, public)`` as the provider last saw them) and the mode's port."""
    private, public = ips.get(instance.id, (instance.address, None))
    return (public if mode.address == "public" else private or instance.address), mode.port


def instance_runner(instance: I, keys: KeyInjector | None,
                    ips: Mapping[str, tuple[str | None, str | None]],
                    runner_factory: Callable[[I], Runner] | None, *, provider: str, hint: str) -> Runner:
    """A cloud provider's ``runner(instance)``: the pinned SSH runner in SSH mode, else the
    caller's ``runner_factory``, else a ``ProviderError`` (code ``NoRunner``) saying ``hint``
    (how to get one)."""
    if keys is not None:
        return keys.runner(instance, lambda i: ssh_address(keys.mode, ips, i))
    if runner_factory is not None:
        return runner_factory(instance)
    raise ProviderError(f"{provider} instances are reached over SSH: {hint}", provider=provider, code="NoRunner")
