"""NetworkPolicy egress, as the emulator's stand-in CNI enforces it.

The policies that select a pod for egress (``podSelector`` matches its labels and
``policyTypes`` holds ``Egress``, or the policy has ``egress`` rules and no types) add up:
a connection is allowed when any rule of any of them allows it (networking.k8s.io/v1
semantics).  A rule allows its ``to`` peers (none: every destination) on its ``ports`` (none:
every port).  Only ``ipBlock`` peers are enforced here (``cidr`` less its ``except``
networks); ``podSelector``/``namespaceSelector`` peers match nothing, since every emulated
pod's IP is 127.0.0.1.  ``endPort`` ranges and named ports are refused.  The result is an
nftables output chain for the pod's network namespace: loopback and replies pass, what a
rule allows passes, the rest is refused at once (TCP with a reset, the rest with an ICMP
administratively-prohibited), as a sandbox's allow-list is on a machine.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from .objects import Obj, match_label_selector

__all__ = ["egress_policies", "egress_ruleset"]


def egress_policies(policies: Iterable[Obj], pod: Obj) -> list[Obj]:
    """The specs of the policies that select ``pod`` for egress."""
    labels = pod["metadata"].get("labels")
    out = []
    for pol in policies:
        spec = pol.get("spec") or {}
        types = spec.get("policyTypes") or (["Ingress", "Egress"] if "egress" in spec else ["Ingress"])
        if "Egress" in types and match_label_selector(spec.get("podSelector"), labels):
            out.append(spec)
    return out


def _family(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str:
    return "ip6" if net.version == 6 else "ip"


def _peer_matches(peer: Any) -> list[str]:
    """nft match expressions for one ``to`` peer (empty: it matches nothing here)."""
    block = peer.get("ipBlock") if isinstance(peer, dict) else None
    if not block:
        return []
    net = ipaddress.ip_network(str(block["cidr"]), strict=False)
    fam = _family(net)
    match = f"{fam} daddr {net}"
    cut = [ipaddress.ip_network(str(e), strict=False) for e in block.get("except") or ()]
    cut = [c for c in cut if c.version == net.version]
    if cut:
        match += f" {fam} daddr != {{ {', '.join(str(c) for c in cut)} }}"
    return [match]


def _port_matches(ports: Any) -> list[str]:
    """nft match expressions for a rule's ``ports`` (``[""]``: every port and protocol)."""
    if not ports:
        return [""]
    out = []
    for p in ports:
        if "endPort" in p or not isinstance(p.get("port"), int):
            raise ValueError(f"the emulator enforces numeric ports only, not {p!r}")
        proto = str(p.get("protocol") or "TCP").lower()
        if proto not in ("tcp", "udp", "sctp"):
            raise ValueError(f"unknown protocol {p.get('protocol')!r}")
        out.append(f"{proto} dport {p['port']}")
    return out


def egress_ruleset(policies: list[Obj]) -> str | None:
    """The nftables ruleset for a pod selected by ``policies`` for egress; None when no policy
    restricts it (none selects it, or a rule allows everything)."""
    if not policies:
        return None
    accepts: list[str] = []
    for spec in policies:
        for rule in spec.get("egress") or ():
            peers = rule.get("to")
            ports = _port_matches(rule.get("ports"))
            if not peers and ports == [""]:
                return None                       # allows every destination on every port
            dests = [m for peer in peers for m in _peer_matches(peer)] if peers else [""]
            accepts += [" ".join(x for x in (d, p) if x) + " accept" for d in dests for p in ports]
    rules = ['oifname "lo" accept', "ct state established,related accept", *accepts,
             "meta l4proto tcp reject with tcp reset", "reject with icmpx type admin-prohibited"]
    body = "".join(f"    {r}\n" for r in rules)
    return ("table inet flowmesh_netpol {\n  chain out {\n"
            "    type filter hook output priority 0; policy drop;\n" + body + "  }\n}\n")
