"""The ``vast`` provider: Vast.ai's GPU marketplace through the ``vastai`` SDK.

Vast instances are containers on a host, not VMs: ``nested_containers=False``, so the
fleet runs GPU workers there (the vLLM/TRL roles) or an ephemeral pool's one sandbox per
instance, and refuses a persistent or auto sandbox pool with the reason.

``offers(spec)``
    ``search_offers`` (``POST /api/v0/bundles/``) for on-demand and, with ``spot=True``,
    interruptible (``type=bid``) machines: the CLI's default filters (verified, rentable,
    not rented) plus ``num_gpus``, ``gpu_name``, ``gpu_ram`` (``min_gpu_ram_gb``),
    ``cpu_cores_effective``, ``cpu_ram``, ``reliability2`` (``min_reliability``),
    ``inet_down`` (``min_inet_down_mbps``), ``cuda_max_good`` (``min_cuda``) and
    ``verified``.  Each offer is one machine: ``Offer.offer_id`` its ask id,
    ``available=1``, ``reliability`` from ``reliability2``, ``price_per_hour`` the live quote
    (``dph_total``; for an interruptible offer the market's ``min_bid``, which the bidder may
    raise), ``instance_type`` ``<n>x-<gpu>``, ``region`` the host's ``geolocation``.
``launch(request)``
    One instance per call (``max_batch`` 1).  Idempotency: the instances whose label
    carries the request id are returned.  Else ``create_instance`` on the ask with the
    configured ``image``, ``disk`` = ``spec.disk_gb``, the SDK's tags as the one ``label``
    (:class:`~flowmesh_sdk.tags.SingleLabel`), the bid (``price``) for an interruptible
    offer, the SSH runtype, and an ``onstart`` that installs the host key injected for this
    request and the fleet's key and starts sshd.  A failed create destroys any instance it
    half-made (found by its label) before the error goes up, so failover to the next offer
    never leaves one behind.
``describe(ids)`` / ``list_tagged(tags)``
    ``show_instances`` (every page), filtered here by id, or by the label's tags (Vast
    cannot filter on part of a label).  ``actual_status`` running -> RUNNING; loading /
    created -> PENDING; exited / stopped (an interruptible instance that was outbid) ->
    STOPPED; offline / destroying -> TERMINATED.
``terminate(ids)``
    ``destroy_instance`` with the list (the bulk ``DELETE /api/v0/instances/``); an id
    already gone is not an error.
``runner(instance)``
    SSH (``ssh=SshMode()``): ``ssh_host``/``ssh_port`` (Vast's proxy), or with
    ``address="public"`` the host's ``public_ipaddr`` and the port mapped to ``22/tcp``;
    exactly the injected host key is accepted (never trust on first use).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flowmesh_sdk.errors import ProviderError, SpecError
from flowmesh_sdk.provider import (TAG_FLEET, TAG_REQUEST, Capabilities, Instance, LaunchRequest, Provider,
                                   ProviderState)
from flowmesh_sdk.redaction import redact_url
from flowmesh_sdk.remote.injection import KeyInjector
from flowmesh_sdk.remote.injection import SshMode as _SshMode
from flowmesh_sdk.remote.runner import Runner
from flowmesh_sdk.specs import InstanceSpec, Offer
from flowmesh_sdk.tags import SingleLabel

from .client import RATES, VastClient
from .errors import PROVIDER

log = logging.getLogger("flowmesh.providers.vast")

DEFAULT_IMAGE = "vllm/vllm-openai:latest"
TAGS = SingleLabel(key="label", max_len=1024)
STATE_MAP = {"running": ProviderState.RUNNING, "loading": ProviderState.PENDING, "created": ProviderState.PENDING,
             "scheduling": ProviderState.PENDING, "exited": ProviderState.STOPPED, "stopped": ProviderState.STOPPED,
             "offline": ProviderState.TERMINATED, "destroying": ProviderState.TERMINATED}
ONSTART_MARK = "FLOWMESH_CLOUD_CONFIG"
_ID = re.compile(r"^\d{1,18}$")
RunnerFactory = Callable[[Instance], Runner]

# What onstart does on the instance: cloud-init's cc_ssh for our #cloud-config, in POSIX sh
# and python3 (which the CUDA/vLLM images carry): host key files 0600, authorized_keys,
# then sshd.  The cloud-config sits in a quoted heredoc, so nothing in it is expanded.
_ONSTART = """#!/bin/sh
# written by flowmesh-sdk: install the injected SSH host key and the fleet key, start sshd (docs/providers/vast.md)
set -e
umask 077
cat > /root/.flowmesh-cloud-config <<'{mark}'
{config}{mark}
python3 - <<'FLOWMESH_PY'
import json, os
text = open("/root/.flowmesh-cloud-config").read()
doc = json.loads(text[text.index("{{"):])
keys = doc["ssh_keys"]
os.makedirs("/etc/ssh", exist_ok=True)
for name, data in (("ssh_host_ed25519_key", keys["ed25519_private"]), ("ssh_host_ed25519_key.pub", keys["ed25519_public"])):
    with open(os.path.join("/etc/ssh", name), "w") as fh:
        fh.write(data if data.endswith("\\n") else data + "\\n")
os.makedirs("/root/.ssh", exist_ok=True)
with open("/root/.ssh/authorized_keys", "a") as fh:
    fh.write("\\n".join(doc.get("ssh_authorized_keys", [])) + "\\n")
FLOWMESH_PY
mkdir -p /run/sshd
{sshd}
"""


class SshMode(_SshMode):
    """:class:`flowmesh_sdk.remote.injection.SshMode` for Vast.ai (errors name ``vast.ssh.*``)."""

    __slots__ = ()
    field_prefix = "vast.ssh"


def onstart_script(cloud_config: str, sshd: str = "(pkill -HUP -x sshd || /usr/sbin/sshd)") -> str:
    return _ONSTART.format(mark=ONSTART_MARK, config=cloud_config if cloud_config.endswith("\n")
                           else cloud_config + "\n", sshd=sshd)


def cloud_config_of(onstart: str | None) -> str | None:
    """The ``#cloud-config`` an onstart of this SDK carries (None for any other onstart)."""
    if not onstart:
        return None
    m = re.search(rf"<<'{ONSTART_MARK}'\n(.*?){ONSTART_MARK}\n", onstart, re.S)
    return m.group(1) if m else None


def instance_type(num_gpus: int, gpu_name: str | None) -> str:
    return f"{num_gpus}x-{(gpu_name or 'cpu').replace(' ', '_')}"


def gpu_short(name: str | None) -> str | None:
    """``RTX 4090`` -> ``rtx4090``, ``H100 SXM`` -> ``h100``, ``A100 PCIE`` -> ``a100``."""
    if not name:
        return None
    words = name.lower().replace("_", " ").split()
    if words and words[0] in ("rtx", "gtx", "tesla", "quadro") and len(words) > 1:
        return words[0] + words[1] if words[0] in ("rtx", "gtx") else words[1]
    return words[0] if words else None


class VastProvider(Provider):
    """Vast.ai.  See the module docstring for what each call does.

    ``api_key`` (default ``VAST_API_KEY``, then the vastai CLI's key file); ``server_url``
    (the emulator: ``http://127.0.0.1:PORT``); ``image`` every instance runs; ``spot``
    whether interruptible offers are searched too; the search filters ``min_reliability``,
    ``min_inet_down_mbps``, ``min_cuda``, ``min_gpu_ram_gb``, ``verified``; ``limit`` offers
    per search; ``ssh`` an :class:`SshMode` (or ``runner_factory``)."""

    name = "vast"
    capabilities = Capabilities(spot=True, gpus=True, stop_start=False, max_batch=1, remote=True, rates=RATES,
                                tags=TAGS, nested_containers=False)

    def __init__(self, *, api_key: str | None = None, server_url: str | None = None, image: str = DEFAULT_IMAGE,
                 spot: bool = True, min_reliability: float = 0.95, min_inet_down_mbps: float = 100.0,
                 min_cuda: float | None = None, min_gpu_ram_gb: float | None = None, verified: bool = True,
                 limit: int = 64, max_workers: int = 4, ssh: _SshMode | bool | None = None,
                 runner_factory: RunnerFactory | None = None) -> None:
        if server_url is not None and not re.match(r"^https?://[^/\s]+/?$", str(server_url)):
            raise SpecError("vast.server_url", "must be an http(s) URL like http://127.0.0.1:PORT, "
                                               f"got {redact_url(str(server_url))!r}")
        if not isinstance(image, str) or not image.strip():
            raise SpecError("vast.image", f"must be an image reference, got {image!r}")
        if not isinstance(min_reliability, (int, float)) or not 0 <= min_reliability <= 1:
            raise SpecError("vast.min_reliability", f"must be in [0, 1], got {min_reliability!r}")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise SpecError("vast.limit", f"must be an integer in [1, 1000], got {limit!r}")
        self.image, self.spot, self.verified, self.limit = image, bool(spot), bool(verified), limit
        self.min_reliability, self.min_inet_down_mbps = float(min_reliability), float(min_inet_down_mbps)
        self.min_cuda, self.min_gpu_ram_gb = min_cuda, min_gpu_ram_gb
        self.ssh = SshMode.coerce(ssh, "vast.ssh")
        if self.ssh is not None and runner_factory is not None:
            raise SpecError("vast.runner_factory", "cannot be combined with ssh=: SSH mode makes the runners")
        if runner_factory is not None and not callable(runner_factory):
            raise SpecError("vast.runner_factory", "must be a callable Instance -> Runner")
        self.runner_factory = runner_factory
        self._keys = KeyInjector(PROVIDER, self.ssh) if self.ssh is not None else None
        self._client = VastClient(api_key=api_key, server_url=server_url, max_workers=max_workers)
        self._spec_of: dict[str, InstanceSpec] = {}
        self._rows: dict[str, Mapping[str, Any]] = {}

    def __repr__(self) -> str:
        return (f"VastProvider(server_url={redact_url(self._client.server_url)!r}, image={self.image!r}"
                f"{', ssh' if self.ssh else ''})")

    # ---- offers --------------------------------------------------------------------
    def _query(self, spec: InstanceSpec) -> dict[str, Any]:
        q: dict[str, Any] = {"cpu_cores_effective": {"gte": spec.cpus}, "cpu_ram": {"gte": spec.memory_gb * 1024},
                             "reliability2": {"gte": self.min_reliability},
                             "inet_down": {"gte": self.min_inet_down_mbps}}
        if spec.gpus:
            q["num_gpus"] = {"gte": spec.gpus}
        if self.min_cuda is not None:
            q["cuda_max_good"] = {"gte": self.min_cuda}
        if self.min_gpu_ram_gb is not None:
            q["gpu_ram"] = {"gte": self.min_gpu_ram_gb * 1024}
        if not self.verified:
            q["verified"] = {"eq": False}
        return q

    def _offer(self, row: Mapping[str, Any], bid: bool) -> Offer | None:
        try:
            gpus = int(row.get("num_gpus") or 0)
            price = float(row["min_bid"] if bid else row["dph_total"])
            rel = row.get("reliability2", row.get("reliability"))
            return Offer(provider=PROVIDER, region=str(row.get("geolocation") or "unknown"),
                         zone=f"machine-{row.get('machine_id')}",
                         instance_type=instance_type(gpus, row.get("gpu_name")),
                         cpus=max(1, int(float(row.get("cpu_cores_effective") or 1))),
                         memory_gb=round(float(row.get("cpu_ram") or 0) / 1024, 3), price_per_hour=max(price, 0.0),
                         gpus=min(gpus, 16), gpu_name=gpu_short(row.get("gpu_name")) if gpus else None, spot=bid,
                         arch="arm64" if str(row.get("cpu_arch", "")).lower() in ("arm64", "aarch64") else "x86_64",
                         gpu_memory_gb=round(float(row.get("gpu_total_ram") or 0) / 1024, 2) or None,
                         source=f"Vast.ai search (ask {row.get('id')})", offer_id=str(row["id"]),
                         reliability=float(rel) if isinstance(rel, (int, float)) and 0 < rel <= 1 else None,
                         available=1)
        except (KeyError, TypeError, ValueError, SpecError):
            return None

    async def offers(self, spec: InstanceSpec) -> list[Offer]:
        q = self._query(spec)
        out = []
        for bid in ([False, True] if self.spot else [False]):
            market = "bid" if bid else "on-demand"

            def search(v: Any, market: str = market) -> Any:
                return v.search_offers(query=dict(q), type=market, order="dph_total", limit=self.limit)
            rows = await self._client.call(f"search ({market})", search)
            for row in rows or []:
                offer = self._offer(row, bid)
                if offer is not None and offer.fits(spec) and (spec.gpu_name is None or offer.gpu_name is not None):
                    out.append(offer)
        return out

    def explain_misfit(self, spec: InstanceSpec) -> str:
        return (f"no rentable Vast.ai offer has {spec.cpus} vCPUs, {spec.memory_gb:g} GiB and {spec.gpus} x "
                f"{spec.gpu_name or 'any'} GPU at reliability >= {self.min_reliability}")

    # ---- instances -----------------------------------------------------------------
    def _to_instance(self, row: Mapping[str, Any]) -> Instance:
        iid = str(row["id"])
        self._rows[iid] = row
        gpus = int(row.get("num_gpus") or 0)
        spec = self._spec_of.get(iid) or InstanceSpec(
            cpus=max(1, int(float(row.get("cpu_cores_effective") or 1))),
            memory_gb=max(0.125, round(float(row.get("cpu_ram") or 1024) / 1024, 3)), gpus=min(gpus, 16),
            gpu_name=gpu_short(row.get("gpu_name")) if gpus else None)
        status = str(row.get("actual_status") or row.get("cur_state") or "loading")
        if str(row.get("intended_status") or "") == "stopped" and status == "running":
            status = "stopped"
        price = row.get("dph_total") if not row.get("is_bid") else row.get("bid_price", row.get("dph_total"))
        return Instance(id=iid, provider=PROVIDER, region=str(row.get("geolocation") or "unknown"),
                        instance_type=instance_type(gpus, row.get("gpu_name")), spec=spec,
                        state=STATE_MAP.get(status, ProviderState.PENDING),
                        tags=TAGS.decode({"label": row.get("label") or ""}),
                        launched_at=float(row.get("start_date") or time.time()),
                        price_per_hour=float(price or 0.0), address=str(row.get("ssh_host") or "") or None,
                        port=int(row["ssh_port"]) if row.get("ssh_port") else None,
                        zone=f"machine-{row.get('machine_id')}" if row.get("machine_id") else None)

    async def _all(self) -> list[Mapping[str, Any]]:
        return list(await self._client.call("show instances", lambda v: v.show_instances()) or [])

    async def _mine(self, wanted: Mapping[str, str]) -> list[Mapping[str, Any]]:
        return [r for r in await self._all() if TAGS.matches(r.get("label"), wanted)]

    async def launch(self, request: LaunchRequest) -> list[Instance]:
        offer = request.offer
        if offer.provider != PROVIDER or not offer.offer_id or not _ID.match(offer.offer_id):
            raise SpecError("launch.offer", f"a Vast.ai offer with its ask id is needed, got {offer.key} "
                                            f"(offer_id {offer.offer_id!r})")
        if request.count != 1:
            raise SpecError("launch.count", f"a Vast.ai offer is one machine: count must be 1, got {request.count}")
        tags = {str(k): str(v) for k, v in request.tags.items()}
        tags[TAG_REQUEST] = request.request_id
        try:
            label = TAGS.encode(tags)["label"]
        except SpecError as exc:
            raise SpecError("launch.tags", str(exc).split(": ", 1)[-1]) from exc
        mine = {TAG_REQUEST: request.request_id}
        earlier = await self._mine(mine)
        if earlier:
            found = [self._to_instance(r) for r in earlier]
            for inst in found:
                self._spec_of[inst.id] = request.spec
            if self._keys is not None:
                await self._keys.recover([i.id for i in found], self._onstart_config)
            return [self._to_instance(r) for r in earlier]
        host_key = None
        onstart = None
        if self._keys is not None:
            text, host_key = await self._keys.user_data(request.request_id)
            onstart = onstart_script(text)
        bid = offer.price_per_hour if offer.spot else None
        ask = int(offer.offer_id)
        # an ephemeral pool's instance is its task's sandbox: the task's image (else the configured one)
        image = request.container.image if request.container is not None else self.image
        try:
            made = await self._client.call(f"create on ask {ask}", lambda v: v.create_instance(
                ask, image=image, disk=float(request.spec.disk_gb), label=label, onstart_cmd=onstart,
                price=bid, ssh=True, direct=True, env={"-p 22:22": "1"}), creating=True)
            if not isinstance(made, Mapping) or not made.get("success") or not made.get("new_contract"):
                raise ProviderError(f"create on ask {ask}: Vast.ai answered without a new contract",
                                    provider=PROVIDER, code="NoContract")
            new_id = str(made["new_contract"])
            self._spec_of[new_id] = request.spec
            if host_key is not None and self._keys is not None:
                await self._keys.pin([new_id], host_key)
            rows = [r for r in await self._mine(mine) if str(r.get("id")) == new_id]
        except BaseException:
            await self._destroy_half_made(mine)
            raise
        out = [self._to_instance(r) for r in rows] or [Instance(
            id=new_id, provider=PROVIDER, region=offer.region, instance_type=offer.instance_type, spec=request.spec,
            state=ProviderState.PENDING, tags=tags, launched_at=time.time(), price_per_hour=offer.price_per_hour or 0.0,
            zone=offer.zone)]
        log.info("vast launch %s: contract %s on ask %s%s", request.request_id, new_id, ask,
                 f" (bid ${bid:.4f}/h)" if bid is not None else "")
        return out

    async def _destroy_half_made(self, mine: Mapping[str, str]) -> None:
        """After a failed create: destroy whatever it made (found by the request's label)."""
        try:
            left = [str(r["id"]) for r in await self._mine(mine)]
            if left:
                log.warning("vast: destroying %d half-made instance(s) %s after a failed create", len(left), left)
                await self.terminate(left)
        except Exception as exc:  # noqa: BLE001 - the create's own error is the one to raise
            log.warning("vast: could not check for half-made instances: %s", exc)

    async def _onstart_config(self, iid: str) -> str | None:
        row = self._rows.get(iid)
        if row is None:
            row = await self._client.call(f"show instance {iid}", lambda v: v.show_instance(int(iid)))
        return cloud_config_of((row or {}).get("onstart"))

    async def describe(self, ids: Sequence[str]) -> list[Instance]:
        wanted = [i for i in dict.fromkeys(ids) if isinstance(i, str) and _ID.match(i)]
        if not wanted:
            return []
        rows = {str(r.get("id")): r for r in await self._all()}
        return [self._to_instance(rows[i]) for i in wanted if i in rows]

    async def list_tagged(self, tags: Mapping[str, str]) -> list[Instance]:
        wanted = {str(k): str(v) for k, v in tags.items()} or None
        out = []
        for r in await self._all():
            have = TAGS.decode({"label": r.get("label") or ""})
            if TAG_FLEET in have and (wanted is None or all(have.get(k) == v for k, v in wanted.items())):
                out.append(self._to_instance(r))
        return out

    async def terminate(self, ids: Sequence[str]) -> None:
        present = [i.id for i in await self.describe(ids)]
        if present:
            await self._client.call(f"destroy {len(present)} instance(s)",
                                    lambda v: v.destroy_instance([int(i) for i in present]))
        if self._keys is not None:
            await self._keys.forget(present)
        for iid in present:
            self._rows.pop(iid, None)

    def runner(self, instance: Instance) -> Runner:
        if self._keys is not None:
            return self._keys.runner(instance, self._address)
        if self.runner_factory is not None:
            return self.runner_factory(instance)
        raise ProviderError("vast instances are reached over SSH: pass VastProvider(ssh=SshMode()) "
                            "(docs/providers/vast.md), or runner_factory=...", provider=PROVIDER, code="NoRunner")

    def _address(self, instance: Instance) -> tuple[str | None, int]:
        assert self.ssh is not None
        row = self._rows.get(instance.id, {})
        if self.ssh.address == "public":
            mapped = ((row.get("ports") or {}).get("22/tcp") or [{}])[0].get("HostPort")
            return row.get("public_ipaddr"), int(mapped or 22)
        return row.get("ssh_host") or instance.address, int(row.get("ssh_port") or instance.port or 22)

    async def close(self) -> None:
        if self._keys is not None:
            await self._keys.close()
        await self._client.close()


__all__ = ["DEFAULT_IMAGE", "SshMode", "VastProvider", "cloud_config_of", "gpu_short", "instance_type",
           "onstart_script"]
