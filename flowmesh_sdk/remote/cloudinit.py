"""``#cloud-config`` user-data that hands a new VM its SSH host key and the fleet's client key.

Why: the SDK pins host keys and never auto-adds them.  On a cloud VM it can do better than
trust on first use: it generates the machine's host key itself, hands it over at launch,
and trusts exactly that key from the first connection on.

What the user-data says (cloud-init's SSH module, ``cc_ssh``; key names as documented in
cloud-init's module reference, section "SSH",
https://cloudinit.readthedocs.io/en/latest/topics/modules.html, and in
``cloudinit/config/cc_ssh.py``):

``ssh_deletekeys: true``
    delete the host keys baked into the image, so the injected key is the only one sshd
    can offer (an AMI's baked keys are shared by every instance made from it);
``ssh_genkeytypes: []``
    generate no other host key types;
``ssh_keys: {ed25519_private, ed25519_public}``
    the host key pair, written to ``/etc/ssh/ssh_host_ed25519_key{,.pub}``;
``ssh_authorized_keys: [fleet public key]``
    the fleet's client key, for the image's default user (and root, below);
``disable_root: false``
    only when the SDK logs in as root: cloud-init otherwise prefixes root's
    ``authorized_keys`` entry with a command that refuses the login.

The document is written as JSON after the ``#cloud-config`` header line: JSON is valid
YAML, so cloud-init (``yaml.safe_load``) reads it, and the SDK reads its own user-data back
with the standard library alone (:func:`parse_user_data`).

Exposure: the user-data carries the host's *private* key.  On EC2 anyone allowed
``ec2:DescribeInstanceAttribute`` on the account can read it, and so can any process on
the instance that reaches the instance metadata service.  The fleet's *client* private
key is never in it.  See docs/ssh.md for what this means and how the ec2 provider limits
it (IMDSv2 with a hop limit of 1).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import SpecError
from .keys import KeyPair, PublicKey

HEADER = "#cloud-config"
#: EC2 limits user data to 16 KB in raw form, before base64 ("Work with instance user
#: data", Amazon EC2 User Guide,
#: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-add-user-data.html).
MAX_USER_DATA_BYTES = 16 * 1024
MARKER = "flowmesh-sdk"


@dataclass(frozen=True, slots=True)
class CloudConfig:
    """What the SDK puts in a launch's user-data: the host key pair, the authorized client
    keys and the login user.  The repr shows fingerprints only."""

    host_key: KeyPair = field(repr=False)
    authorized_keys: tuple[PublicKey, ...]
    user: str = "root"

    def __post_init__(self) -> None:
        if not isinstance(self.host_key, KeyPair) or self.host_key.public.key_type != "ssh-ed25519":
            raise SpecError("cloudinit.host_key", "must be an ed25519 KeyPair (keys.generate_ed25519())")
        keys = tuple(self.authorized_keys)
        if not keys or not all(isinstance(k, PublicKey) for k in keys):
            raise SpecError("cloudinit.authorized_keys", "must be one or more PublicKey (the fleet's key)")
        object.__setattr__(self, "authorized_keys", keys)
        if not isinstance(self.user, str) or not self.user or not self.user.replace("-", "").replace(
                "_", "").isalnum():
            raise SpecError("cloudinit.user",
                            f"must be a login name like 'root' or 'ubuntu', got {self.user!r}")

    def __repr__(self) -> str:
        return (f"CloudConfig(host_key={self.host_key.public}, authorized_keys="
                f"{[str(k) for k in self.authorized_keys]}, user={self.user!r})")

    def document(self) -> dict:
        """The cloud-config as a dict (holds the private host key: do not log it)."""
        doc: dict = {
            "ssh_deletekeys": True,
            "ssh_genkeytypes": [],
            "ssh_keys": {
                "ed25519_private": self.host_key.private_openssh(),
                "ed25519_public": f"{self.host_key.public.line} {MARKER}-host",
            },
            "ssh_authorized_keys": [f"{k.line} {MARKER}-fleet" for k in self.authorized_keys],
        }
        if self.user == "root":
            doc["disable_root"] = False
        return doc

    def render(self) -> str:
        """The user-data text: ``#cloud-config`` and the document as JSON (valid YAML)."""
        text = f"{HEADER}\n# written by {MARKER}: host key and fleet key (docs/ssh.md)\n" + \
            json.dumps(self.document(), indent=1, sort_keys=True) + "\n"
        if len(text.encode()) > MAX_USER_DATA_BYTES:
            raise SpecError("cloudinit.user_data", f"{len(text.encode())} bytes; at most {MAX_USER_DATA_BYTES} "
                                                   f"before base64 (the smallest user-data limit of the clouds)")
        return text


def build_user_data(host_key: KeyPair, authorized_keys: Sequence[PublicKey], *, user: str = "root") -> str:
    """``#cloud-config`` user-data injecting ``host_key`` and ``authorized_keys``."""
    return CloudConfig(host_key, tuple(authorized_keys), user).render()


@dataclass(frozen=True, slots=True)
class ParsedUserData:
    """What :func:`parse_user_data` found in user-data the SDK wrote: the host's public key
    (the one to pin) and the authorized client keys.  The private host key is not kept."""

    host_public: PublicKey
    authorized_keys: tuple[PublicKey, ...]
    deletes_image_keys: bool


def parse_user_data(text: str | bytes) -> ParsedUserData:
    """Read back user-data written by :func:`build_user_data` (e.g. fetched with
    DescribeInstanceAttribute for an instance another process launched).  SpecError
    (field ``cloudinit.user_data``) when it is not such user-data; the message never
    quotes the text, which holds a private key."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    lines = text.splitlines()
    if not lines or lines[0].strip() != HEADER:
        raise SpecError("cloudinit.user_data", f"does not start with {HEADER!r}")
    body = "\n".join(line for line in lines[1:] if not line.lstrip().startswith("#"))
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise SpecError("cloudinit.user_data", "is not the JSON cloud-config this SDK writes") from exc
    keys = doc.get("ssh_keys") if isinstance(doc, dict) else None
    if not isinstance(keys, dict) or not isinstance(keys.get("ed25519_public"), str):
        raise SpecError("cloudinit.user_data", "has no ssh_keys.ed25519_public")
    host = PublicKey.parse(keys["ed25519_public"], field_name="cloudinit.ssh_keys.ed25519_public")
    auth = doc.get("ssh_authorized_keys") or []
    if not isinstance(auth, list):
        raise SpecError("cloudinit.user_data", "ssh_authorized_keys must be a list")
    return ParsedUserData(host, tuple(PublicKey.parse(k, field_name="cloudinit.ssh_authorized_keys")
                                      for k in auth), bool(doc.get("ssh_deletekeys", True)))


__all__ = ["CloudConfig", "HEADER", "MAX_USER_DATA_BYTES", "ParsedUserData", "build_user_data",
           "parse_user_data"]
