"""The network half of :class:`~flowmesh_sdk.remote.runtime.ContainerRuntime`: what a
sandbox's network needs (:meth:`SandboxNetwork.rules`, checked before its container
starts) and those rules applied from the host, inside the started container's network
namespace, before any command of the sandbox's runs (:meth:`SandboxNetwork.apply`):

* with any network: routes of type ``unreachable`` for the cloud metadata addresses
  (``nsenter -n ip route``); the sandbox holds no CAP_NET_ADMIN to remove them;
* with an egress allow-list: an nftables output chain (:func:`egress_ruleset`,
  ``nsenter -n nft``) that accepts loopback, replies and the listed destinations and
  refuses the rest at once.

:class:`SandboxNetwork` is a component the runtime makes per use (its ``network``), built
as :class:`~.runtime_images.RuntimeImages` is (both are a
:class:`~.runtime_images.RuntimePart`).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from ..errors import ContainerRuntimeError
from ..specs import SandboxSpec, allow_list_host
from .runtime_config import RuntimeInfo
from .runtime_images import RuntimePart

# the pid of a container's first process, found from the host: "$1" the runtime, "$2" the container
_PID = ('pid=$("$1" inspect --format "{{.State.Pid}}" "$2") && [ "${pid:-0}" -gt 0 ] || '
        '{ echo "no pid for $2" >&2; exit 1; }; ')


@dataclass(frozen=True, slots=True)
class NetworkRules:
    """What one sandbox's network needs once its container runs."""

    block: bool = False                      # the metadata networks made unreachable
    allow: tuple[str, ...] | None = None     # the egress allow-list, if any
    hosts: Mapping[str, Sequence[str]] = field(default_factory=lambda: MappingProxyType({}))   # its host names, resolved


_OPEN = NetworkRules()   # no network, or one with nothing to apply


def refuse(match: str) -> list[str]:
    """nft rules that refuse what ``match`` selects at once: TCP with a reset, the rest with
    an ICMP administratively-prohibited (``icmpx``: ICMPv4 or ICMPv6 as the packet is)."""
    return [f"{match}meta l4proto tcp reject with tcp reset",
            f"{match}reject with icmpx type admin-prohibited"]


def egress_ruleset(allow: Sequence[str], hosts: Mapping[str, Sequence[str]],
                   metadata_networks: Sequence[str]) -> str:
    """The nftables ruleset that lets a sandbox reach only ``allow`` (and never
    ``metadata_networks``): loopback and replies pass, everything else is refused at once,
    TCP with a reset and the rest with an ICMP administratively-prohibited, IPv4 and IPv6
    alike.  (Only ICMP for TCP would leave a connect waiting a second now and then: an ICMP
    error that arrives while ``connect()`` still holds its socket is only a soft error, and
    the connection fails at the SYN's retransmission.)"""
    rules = ['oifname "lo" accept', "ct state established,related accept"]
    for net in metadata_networks:
        fam = "ip6" if ":" in net else "ip"
        rules += refuse(f"{fam} daddr {net} ")
    for entry in allow:
        if "/" in entry:
            fam = "ip6" if ":" in entry else "ip"
            rules.append(f"{fam} daddr {entry} accept")
            continue
        host, _, port = entry.rpartition(":")
        addrs = list(hosts.get(host, ())) if allow_list_host(entry) else [host.strip("[]")]
        for addr in addrs:
            fam = "ip6" if ":" in addr else "ip"
            rules += [f"{fam} daddr {addr} tcp dport {int(port)} accept",
                      f"{fam} daddr {addr} udp dport {int(port)} accept"]
    rules += refuse("")
    body = "".join(f"    {r}\n" for r in rules)
    return ("table inet flowmesh_egress {\n  chain out {\n"
            "    type filter hook output priority 0; policy drop;\n" + body + "  }\n}\n")


class SandboxNetwork(RuntimePart):
    """A sandbox's network rules on ``runner``'s machine (see the module docstring)."""

    __slots__ = ()

    async def rules(self, spec: SandboxSpec, info: RuntimeInfo) -> NetworkRules:
        """What ``spec``'s network needs, with its allow-list's host names resolved on this
        machine; an error, before anything starts, where the machine cannot enforce it."""
        allow = spec.network if isinstance(spec.network, tuple) else None
        block = bool(spec.network) and self.config.block_metadata and bool(self.config.metadata_networks)
        if block and not info.netns_tools:
            raise ContainerRuntimeError(
                f"a sandbox with network needs `nsenter` and `ip` on {self.runner.label} (and root) "
                "to make the cloud metadata address unreachable from it; install util-linux and iproute2, "
                "or set RuntimeConfig(block_metadata=False) where no metadata service exists")
        if allow is not None and not (info.netns_tools and info.nft):
            raise ContainerRuntimeError(
                f"a sandbox with an egress allow-list needs `nsenter` and `nft` on {self.runner.label} "
                "(and root) to enforce it; install util-linux and nftables (`apt-get install -y nftables`)")
        if not block and allow is None:
            return _OPEN
        hosts = {} if allow is None else await self._resolve(
            [h for e in allow if (h := allow_list_host(e)) is not None])
        return NetworkRules(block, allow, MappingProxyType(hosts))

    async def apply(self, container: str, rules: NetworkRules) -> None:
        """``rules`` in the started ``container``'s network namespace, from the host."""
        if rules.block:
            await self._block_metadata(container)
        if rules.allow is not None:
            await self._allow_only(container, rules.allow, rules.hosts)

    async def _resolve(self, names: Sequence[str]) -> dict[str, list[str]]:
        """Addresses of allow-list host names, resolved on the machine that runs the sandbox."""
        out: dict[str, list[str]] = {}
        for name in sorted(set(names)):
            res = await self._run(["getent", "ahosts", name], check=False)
            addrs: list[str] = []
            for line in res.text().splitlines():
                addr = line.split()[0] if line.split() else ""
                if addr and addr not in addrs:
                    addrs.append(addr)
            if not res.ok or not addrs:
                raise ContainerRuntimeError(f"the allow-list host {name} does not resolve on "
                                            f"{self.runner.label}: {res.describe()}")
            out[name] = sorted(addrs, key=lambda a: (":" in a, a))
        return out

    async def _allow_only(self, container: str, allow: Sequence[str],
                          hosts: Mapping[str, Sequence[str]]) -> None:
        """Enforce the egress allow-list inside the container's network namespace, from the
        host (the sandbox holds no CAP_NET_ADMIN to change it)."""
        info = await self.probe()
        ruleset = egress_ruleset(allow, hosts, self.config.metadata_networks)
        res = await self.runner.run(["sh", "-c", _PID + 'exec nsenter -t "$pid" -n nft -f -', "sh",
                                     info.binary, container],
                                    timeout_s=self.config.command_timeout_s, input=ruleset.encode())
        if not res.ok:
            raise ContainerRuntimeError(f"could not apply the egress allow-list to {container} on "
                                        f"{self.runner.label}: {res.describe()}")

    async def _block_metadata(self, container: str) -> None:
        """Make the metadata addresses unreachable inside the container's network namespace
        (from the host: the sandbox itself holds no CAP_NET_ADMIN to undo it)."""
        info = await self.probe()
        v4 = [n for n in self.config.metadata_networks if ":" not in n]
        v6 = [n for n in self.config.metadata_networks if ":" in n]
        script = (_PID + "shift 2; "
                  + "".join(f'nsenter -t "$pid" -n ip route add unreachable {shlex.quote(n)} || exit 1; '
                            for n in v4)
                  # IPv6 may be off in the namespace: then there is no v6 route to block
                  + "".join(f'nsenter -t "$pid" -n ip -6 route add unreachable {shlex.quote(n)} '
                            '2>/dev/null || true; ' for n in v6))
        res = await self._run(["sh", "-c", script, "sh", info.binary, container], check=False)
        if not res.ok:
            raise ContainerRuntimeError(f"could not block the metadata addresses in {container} on "
                                        f"{self.runner.label}: {res.describe()}")


__all__ = ["NetworkRules", "SandboxNetwork", "egress_ruleset", "refuse"]
