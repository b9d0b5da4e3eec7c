"""A TEST FIXTURE emulating cloud-init on a VM, for the ``ec2`` provider's SSH mode.

moto records instances but boots nothing.  :class:`CloudInitVms` stands in for the boot:
for each instance the provider asks about, it reads the instance's user-data back over the
real EC2 API (``DescribeInstanceAttribute``, ``Attribute=userData``, boto3 against the moto
server), parses the ``#cloud-config`` with ``yaml.safe_load`` as cloud-init does, applies
what cloud-init's SSH module (``cc_ssh``) would -- ``ssh_keys.ed25519_private`` /
``ed25519_public`` become the host key files (0600), ``ssh_authorized_keys`` the
authorized keys -- and "boots" a :class:`~flowmesh_sdk.testing.sshd.LoopbackSshd` on a
fresh 127.0.0.N with exactly those keys.  Its :meth:`address` is the provider's
``SshMode(address_map=...)`` hook: the instance's address becomes that loopback host (on
EC2 it is the instance's IP)::

    with CloudInitVms(moto) as vms:
        ec2 = moto.provider(ssh=SshMode(address_map=vms.address))
        ...

It is not cloud-init: it handles only the SSH keys (and refuses user-data that asks
to keep the image's own host keys, which the emulated image does not have), and booting
is synchronous (the hook runs when the provider makes a runner; starting sshd takes
tens of milliseconds).  ``ignore_injected_host_key=True`` boots VMs that present a host
key of their own instead of the injected one: a man in the middle, or an image whose
cloud-init did not apply ``ssh_keys`` -- the client must refuse them.
"""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from .sshd import LoopbackSshd, bin_dir_without

__all__ = ["BootedVm", "CloudInitHosts", "CloudInitVms"]


class BootedVm:
    """One emulated VM: its instance id, its sshd, and the keys cloud-init installed."""

    def __init__(self, instance_id: str, sshd: LoopbackSshd, authorized_keys: list[str],
                 injected_host_public: str) -> None:
        self.instance_id = instance_id
        self.sshd = sshd
        self.authorized_keys = authorized_keys
        #: the public host key the user-data asked for (``type base64``)
        self.injected_host_public = injected_host_public

    def __repr__(self) -> str:
        return f"BootedVm({self.instance_id} -> {self.sshd.host}:{self.sshd.port})"


class CloudInitHosts:
    """A TEST FIXTURE: "boots" instances from their ``#cloud-config`` user-data as loopback
    sshd hosts (what cloud-init's ``cc_ssh`` would do with the keys); shared by the EC2
    stand-in (:class:`CloudInitVms`) and the GCE and Azure emulators."""

    def __init__(self, *, first_host: int = 40, ignore_injected_host_key: bool = False,
                 without_runtime: bool = False, **sshd_kwargs: Any) -> None:
        """``without_runtime``: the machines have no podman or docker on their PATH (a
        Vast.ai instance is itself a container)."""
        self.ignore_injected_host_key = ignore_injected_host_key
        self._next = first_host
        self._sshd_kwargs = sshd_kwargs
        self._vms: dict[str, BootedVm] = {}
        self._halting: list[threading.Thread] = []
        self._halt_errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._tmp = Path(tempfile.mkdtemp(prefix="fm-cloudinit-"))
        os.chmod(self._tmp, 0o700)
        if without_runtime and "path" not in sshd_kwargs:
            self._sshd_kwargs["path"] = bin_dir_without(self._tmp / "bin")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self._vms)} booted)"

    def vm(self, instance_id: str) -> BootedVm:
        return self._vms[instance_id]

    @property
    def vms(self) -> dict[str, BootedVm]:
        return dict(self._vms)

    def booted(self, instance_id: str) -> BootedVm | None:
        return self._vms.get(instance_id)

    def boot(self, instance_id: str, text: str, *, extra_authorized: tuple[str, ...] = ()) -> BootedVm:
        """Boot ``instance_id`` (once) from its user-data ``text``."""
        with self._lock:
            vm = self._vms.get(instance_id)
            if vm is not None:
                return vm
            import yaml  # cloud-init parses cloud-config with PyYAML's safe_load

            if not text.startswith("#cloud-config"):
                raise RuntimeError(f"{instance_id}: user-data is not #cloud-config; cloud-init would "
                                   "not configure SSH from it")
            cfg = yaml.safe_load(text) or {}
            keys = cfg.get("ssh_keys") or {}
            private, public = keys.get("ed25519_private"), keys.get("ed25519_public")
            if not private or not public:
                raise RuntimeError(f"{instance_id}: the cloud-config has no ssh_keys.ed25519_private/public")
            if not cfg.get("ssh_deletekeys", True):
                raise RuntimeError(f"{instance_id}: ssh_deletekeys is false: the emulated image has no "
                                   "host keys of its own to keep")
            authorized = list(dict.fromkeys([str(k) for k in cfg.get("ssh_authorized_keys") or []]
                                            + list(extra_authorized)))
            home = self._tmp / instance_id
            home.mkdir(mode=0o700)
            key_path = None
            if not self.ignore_injected_host_key:
                # what cc_ssh writes: /etc/ssh/ssh_host_ed25519_key{,.pub}, both 0600
                key_path = home / "ssh_host_ed25519_key"
                for path, data in ((key_path, private), (Path(str(key_path) + ".pub"), public)):
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "w") as fh:
                        fh.write(data if data.endswith("\n") else data + "\n")
            host = f"127.0.0.{self._next}"
            self._next += 1
            sshd = LoopbackSshd(host, host_key_path=str(key_path) if key_path else None,
                                authorized_keys=authorized, **self._sshd_kwargs)
            sshd.start()
            pub = public.split()
            vm = BootedVm(instance_id, sshd, authorized, f"{pub[0]} {pub[1]}")
            self._vms[instance_id] = vm
            return vm

    def halt(self, instance_id: str) -> None:
        """The VM is gone (deleted): its sshd stops, its containers and storage go."""
        with self._lock:
            vm = self._vms.pop(instance_id, None)
        if vm is not None:
            vm.sshd.stop(cleanup=True)

    def halt_soon(self, instance_id: str) -> None:
        """:meth:`halt` in a thread of its own (an emulator answers the delete at once);
        :meth:`close` waits for it, and the thread is not a daemon, so an interpreter that
        exits without closing still lets it finish removing the VM's containers and files."""
        def run() -> None:
            try:
                self.halt(instance_id)
            except BaseException as exc:   # raised again by close()
                with self._lock:
                    self._halt_errors.append(exc)
        t = threading.Thread(target=run, name=f"halt-{instance_id}")
        with self._lock:
            self._halting.append(t)
        t.start()

    def close(self) -> None:
        with self._lock:
            halting, self._halting = self._halting, []
        for t in halting:
            t.join()
        with self._lock:
            vms, self._vms = list(self._vms.values()), {}
            errors, self._halt_errors = self._halt_errors, []
        for vm in vms:
            vm.sshd.stop(cleanup=True)
        shutil.rmtree(self._tmp, ignore_errors=True)
        if errors:
            raise errors[0]

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CloudInitVms(CloudInitHosts):
    """A TEST FIXTURE: moto instances booted as loopback sshd hosts from their user-data."""

    def __init__(self, moto: Any, *, region: str = "us-east-1", first_host: int = 40,
                 ignore_injected_host_key: bool = False, **sshd_kwargs: Any) -> None:
        super().__init__(first_host=first_host, ignore_injected_host_key=ignore_injected_host_key, **sshd_kwargs)
        self.moto = moto
        self.region = region
        self._client: Any = None

    # ---- the provider's address hook -------------------------------------------------
    def address(self, instance: Any) -> tuple[str, int]:
        """``SshMode.address_map``: boot ``instance`` (once) and return its sshd's address."""
        vm = self.booted(instance.id) or self.boot(instance.id, self.user_data(instance.id))
        return vm.sshd.host, vm.sshd.port

    def user_data(self, instance_id: str) -> str:
        """The instance's user-data as EC2 returns it (DescribeInstanceAttribute), decoded."""
        if self._client is None:
            self._client = self.moto.client(self.region)
        resp = self._client.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        raw = (resp.get("UserData") or {}).get("Value") or ""
        return base64.b64decode(raw).decode()
