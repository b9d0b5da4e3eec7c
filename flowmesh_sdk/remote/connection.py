"""One SSH connection through fabric: the user's ssh config, jump hosts, agent, host-key trust.

:func:`open_connection` makes a ``fabric.Connection`` for an
:class:`~flowmesh_sdk.remote.ssh_target.SshTarget` with a ``fabric.Config`` that loads the ssh
config (the target's ``ssh_config`` file when it names one, else OpenSSH's
``/etc/ssh/ssh_config`` and ``~/.ssh/config``), so a host may be an alias and its
``HostName``, ``User``, ``Port``, ``IdentityFile``, ``ProxyJump`` (one jump host or a
chain, visited in the order written; fabric builds a gateway ``Connection`` per hop),
``ProxyCommand`` (run through the user's shell as OpenSSH runs it: :mod:`.proxycommand`),
``ConnectTimeout``, ``HostKeyAlias`` and ``UserKnownHostsFile`` apply; what the target
gives explicitly (port, user, key) wins over the config, as on ``ssh``'s command line.

Fabric's own host-key handling is replaced on every hop: fabric gives each
``SSHClient`` paramiko's ``AutoAddPolicy`` (any key accepted and remembered), here each
hop gets a policy that asks :class:`~flowmesh_sdk.remote.trust.HostTrust` and a
transport that negotiates the key types it wants (the pinned type only; certificates
first when the user's known_hosts lists a CA for the host).  The decision is taken after
the key exchange and before any authentication.

Authentication: with the target's ``key_path``, that key (and the ssh config's
``IdentityFile``) only; without it, as ``ssh`` would: the ``IdentityFile`` keys, the
keys of the running ``ssh-agent`` (``SSH_AUTH_SOCK``), then ``~/.ssh/id_*``.  Jump hosts
authenticate the same way, with the target's key offered too.

Everything here blocks (sockets, file reads): the runner calls it in a worker thread.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import AuthError, FlowMeshError, ProviderUnavailableError, SpecError
from . import proxycommand
from .proxycommand import ShellProxy
from .trust import HostTrust, hop_names

if TYPE_CHECKING:
    from .ssh_target import SshTarget

try:  # fabric (and paramiko) are the optional extra ``ssh``
    import fabric
    import paramiko
except ImportError:  # pragma: no cover - exercised only without the extra
    fabric = paramiko = None

DEFAULT_CONNECT_TIMEOUT_S = 10.0


def need_fabric() -> None:
    if fabric is None:
        raise ImportError("SSH needs fabric and paramiko: pip install 'flowmesh-sdk[ssh]'")


@dataclass(frozen=True, slots=True)
class Resolved:
    """Where a target really goes once its ssh config is applied."""

    host: str
    port: int
    user: str
    jumps: tuple[str, ...]     # the jump hosts, first hop first ("user@host:port")
    proxy_command: bool
    connect_timeout_s: float

    @property
    def direct(self) -> bool:
        return not self.jumps and not self.proxy_command


def _config(target: SshTarget, timeout_s: float | None) -> Any:
    overrides: dict[str, Any] = {"timeouts": {"connect": math.ceil(timeout_s or DEFAULT_CONNECT_TIMEOUT_S)}}
    if target.ssh_config == "":
        overrides["load_ssh_configs"] = False
        return fabric.Config(overrides=overrides)
    return fabric.Config(overrides=overrides, runtime_ssh_path=target.ssh_config or None)


def _label(c: Any) -> str:
    return f"{c.user}@{c.host}:{c.port}"


def _chain(c: Any) -> list[Any]:
    """The connection and its gateway connections, the target first."""
    out = [c]
    while isinstance(out[-1].gateway, fabric.Connection):
        out.append(out[-1].gateway)
    return out


def build(target: SshTarget, timeout_s: float | None = None) -> Any:
    """The fabric Connection for ``target`` (not opened: no network yet, but the ssh
    config files are read).  ``timeout_s`` None: the ssh config's ``ConnectTimeout``, else 10 s.
    An ssh config that cannot be read or applied (a missing file, a line paramiko cannot
    parse, a ``Port`` that is no number) is a :class:`SpecError` on ``ssh.ssh_config``."""
    need_fabric()
    try:
        return _build(target, timeout_s)
    except FlowMeshError:
        raise
    except Exception as exc:  # noqa: BLE001 - fabric/paramiko/invoke raise anything here; never raw
        where = f"the ssh config {target.ssh_config}" if target.ssh_config else (
            "no ssh config" if target.ssh_config == "" else "the ssh config (/etc/ssh/ssh_config, ~/.ssh/config)")
        raise SpecError("ssh.ssh_config", f"{target.label}: {where} could not be applied: "
                                          f"{type(exc).__name__}: {exc}") from exc


def _build(target: SshTarget, timeout_s: float | None) -> Any:
    kwargs: dict[str, Any] = {}
    if target.key_path and not os.access(target.key_path, os.R_OK):
        raise AuthError(f"{target.label}: cannot read the private key {target.key_path}", provider="ssh")
    if target.key_path:
        kwargs = {"key_filename": [target.key_path], "allow_agent": False, "look_for_keys": False}
    else:
        kwargs = {"allow_agent": True, "look_for_keys": True}
    cfg = _config(target, timeout_s)
    c = fabric.Connection(target.host, user=target.user or None, port=target.port or None, config=cfg,
                          connect_timeout=math.ceil(timeout_s) if timeout_s else None,
                          connect_kwargs=kwargs, gateway=_jump_chain(cfg, target.host))
    for hop in _chain(c)[1:]:
        keys = list(hop.connect_kwargs.get("key_filename") or [])
        if target.key_path and target.key_path not in keys:
            keys.append(target.key_path)
        hop.connect_kwargs = {**hop.connect_kwargs, "allow_agent": True, "look_for_keys": True,
                              **({"key_filename": keys} if keys else {})}
    return c


def _jump_chain(cfg: Any, host: str) -> Any:
    """The gateway for a ``ProxyJump`` of two hops or more, visited in the order written,
    as ssh visits it (fabric 3.2 chains such a list last hop first: its first connection
    would go to the last jump host, which is often reachable only through the first).
    None (fabric's own resolution) for one hop, a ProxyCommand or no jump host."""
    jumps = [h.strip() for h in str(cfg.base_ssh_config.lookup(host).get("proxyjump", "")).split(",")]
    jumps = [h for h in jumps if h and h.lower() != "none"]
    if len(jumps) < 2:
        return None
    gateway = None
    for hop in jumps:
        gateway = fabric.Connection(hop, config=cfg.clone(), **({"gateway": gateway} if gateway else {}))
    return gateway


def resolve(c: Any) -> Resolved:
    chain = _chain(c)
    return Resolved(c.host, int(c.port), c.user, tuple(_label(h) for h in reversed(chain[1:])),
                    isinstance(c.gateway, str), float(c.connect_timeout or DEFAULT_CONNECT_TIMEOUT_S))


class _Policy:
    """paramiko's missing-host-key hook (the SSHClient has no host keys of its own, so it
    is asked for every server): :meth:`HostTrust.verify`."""

    def __init__(self, trust: HostTrust, c: Any, label: str) -> None:
        self.trust, self.label = trust, label
        self.known = trust.known_hosts(c.ssh_config)
        self.names = hop_names(c.host, int(c.port), c.ssh_config)

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        blob = getattr(key, "public_blob", None)
        cert = blob.key_blob if blob is not None and blob.key_type.endswith("-cert-v01@openssh.com") else None
        kh_name, principal = self.names
        self.trust.verify(self.known, [kh_name], key.get_name(), key.asbytes(), cert, self.label, principal)

    def transport(self, sock: Any, disabled_algorithms: Any = None) -> Any:
        t = paramiko.Transport(sock, disabled_algorithms=disabled_algorithms)
        opts = t.get_security_options()
        plain = list(opts.key_types)   # paramiko appends the certificate variants only after these
        available = plain + [k + "-cert-v01@openssh.com" for k in plain]
        opts.key_types = self.trust.key_types(self.known, [self.names[0]], available, self.label)
        return t


if paramiko is not None:
    class _Unexpanded(paramiko.SSHConfig):
        """The ssh config as read, with ``ProxyCommand`` left as written: paramiko replaces
        ``~``, ``%h``, ``%p`` and ``%r`` in it by plain string replacement (``%%h`` becomes a
        ``%`` and the host), with the config's user and port rather than the ones given."""

        TOKENS_BY_CONFIG_KEY = {k: v for k, v in paramiko.SSHConfig.TOKENS_BY_CONFIG_KEY.items()
                                if k != "proxycommand"}


def _proxy(c: Any) -> ShellProxy:
    """Start the ProxyCommand of ``c`` (a hop whose gateway fabric resolved to one) as
    OpenSSH does (:mod:`.proxycommand`), in place of fabric's (paramiko's ``ProxyCommand``
    splits it without a shell, and fabric expands its tokens a second time)."""
    raw = _Unexpanded()
    raw._config = c.config.base_ssh_config._config   # the rules fabric parsed, read-only here
    written = raw.lookup(c.original_host).get("proxycommand") or c.gateway
    command = proxycommand.expand(str(written), host=c.host, port=int(c.port), user=c.user,
                                  alias=c.original_host, key_alias=c.ssh_config.get("hostkeyalias"))
    return ShellProxy(command)


def _open_one(c: Any, trust: HostTrust, label: str, timeout_s: float) -> None:
    policy = _Policy(trust, c, label)
    c.client.set_missing_host_key_policy(policy)
    c.connect_kwargs = {**c.connect_kwargs, "transport_factory": policy.transport,
                        "banner_timeout": timeout_s, "auth_timeout": timeout_s, "channel_timeout": timeout_s}
    proxy: ShellProxy | None = None
    try:
        if isinstance(c.gateway, str):
            proxy = _proxy(c)
            c.gateway = None    # so fabric does not start its own
            c.connect_kwargs = {**c.connect_kwargs, "sock": proxy}
            label = f"{label} via ProxyCommand"
        try:
            c.open()
        except BaseException:
            if proxy is not None:
                proxy.close()
            raise
    except (AuthError, SpecError):
        raise
    except paramiko.AuthenticationException as exc:
        raise AuthError(f"{label}: the server refused every key offered for {c.user} "
                        f"({type(exc).__name__})", provider="ssh") from exc
    except paramiko.SSHException as exc:
        if "Incompatible ssh" in str(exc) or "no acceptable host key" in str(exc):
            wanted = f"no {trust.pinned.key_type} host key (pinned)" if trust.pinned else "no usable host key"
            raise AuthError(f"{label}: the server offers {wanted}: {exc}", provider="ssh") from exc
        if "No authentication methods available" in str(exc):
            raise AuthError(f"{label}: no key to log in as {c.user} with: no key_path, no IdentityFile in "
                            "the ssh config, no ssh-agent (SSH_AUTH_SOCK) and no ~/.ssh/id_* key",
                            provider="ssh") from exc
        raise ProviderUnavailableError(f"{label}: SSH handshake failed: {exc}{_why(proxy)}",
                                       provider="ssh") from exc
    except (OSError, EOFError) as exc:
        raise ProviderUnavailableError(f"{label}: cannot connect: {exc or type(exc).__name__}{_why(proxy)}",
                                       provider="ssh") from exc
    except FlowMeshError:
        raise
    except Exception as exc:  # noqa: BLE001 - nothing but the SDK's errors leaves the connect path
        raise ProviderUnavailableError(f"{label}: cannot connect: {type(exc).__name__}: {exc}{_why(proxy)}",
                                       provider="ssh") from exc


def _why(proxy: ShellProxy | None) -> str:
    return f" ({proxy.stderr_tail()})" if proxy is not None else ""


def open_connection(c: Any, trust: HostTrust, *, keepalive_s: float = 0) -> Any:
    """Open ``c`` (from :func:`build`): each jump host first, then the target, every hop
    checked by ``trust`` (the jump hosts without the target's pin).  Returns ``c``;
    on failure everything opened is closed and the error says which hop failed."""
    chain = _chain(c)
    timeout_s = float(c.connect_timeout or DEFAULT_CONNECT_TIMEOUT_S)
    try:
        for hop in reversed(chain[1:]):
            _open_one(hop, trust.for_jump_host(), f"jump host {_label(hop)}", timeout_s)
        _open_one(c, trust, f"{trust.name} ({_label(c)})" if trust.name else _label(c), timeout_s)
        if keepalive_s:
            c.transport.set_keepalive(int(max(1, keepalive_s)))
    except BaseException:
        close_connection(c)
        raise
    return c


def close_connection(c: Any) -> None:
    """Close the target's connection and every jump host's."""
    for hop in _chain(c):
        try:
            hop.close()
        finally:
            hop.client.close()   # fabric skips it when the transport already died
