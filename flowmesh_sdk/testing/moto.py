"""A test fixture: moto's EC2 in server mode on 127.0.0.1, for the ``ec2`` provider.

::

    with MotoEc2() as moto:
        provider = moto.provider()                  # Ec2Provider pointed at moto, an AMI picked
        offers = await provider.offers(InstanceSpec(cpus=8, memory_gb=16))
        ...
        moto.reset()                                # forget every instance (POST /moto-api/reset)

It starts ``moto.server.ThreadedMotoServer`` (a werkzeug server in a daemon thread of
this process) on a free port of 127.0.0.1.  Dummy credentials live only in the objects
it builds (``moto.session_kwargs`` is passed to boto3 sessions): ``os.environ`` is not
touched, so nothing leaks into other tests or into a real AWS call.

AMI and instance-type validation are switched on while the server runs.  moto reads
``MOTO_ENABLE_AMI_VALIDATION`` / ``MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION`` from the
environment ONCE, when ``moto.settings`` is first imported, into module constants that
``RunInstances`` consults on each request (``settings.ENABLE_AMI_VALIDATION``); setting
the environment variables works only before moto's first import in the process, so this
fixture sets the module constants themselves (same process: the threaded server shares
them) and restores them on stop.  With validation on, ``RunInstances`` with an unknown
AMI answers ``InvalidAMIID.NotFound`` and an unknown type ``InvalidInstanceType``, as
EC2 does.

What moto does and does not do (moto 5.x, checked here): ``DescribeInstanceTypes`` is
supported (~1,400 types, every region the same list; the ``instance-type`` filter
works); ``RunInstances`` launches ``MinCount`` instances (``MaxCount`` above it is
ignored), stores ``ClientToken`` but does NOT honour it (the same token launches again),
applies ``TagSpecifications`` to instances and their volumes, and marks a spot launch
with ``InstanceLifecycle=spot``; ``DescribeInstances`` supports the ``instance-id``,
``tag:KEY``, ``tag-key`` and ``instance-state-name`` filters and ``MaxResults``
pagination (by reservation).  It needs no credentials but boto3 must sign requests,
hence the dummy keys.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from typing import Any

__all__ = ["MotoEc2"]

DUMMY_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing",
                     "aws_session_token": "testing"}


class MotoEc2:
    """moto's EC2 server on 127.0.0.1 (a test fixture)."""

    def __init__(self, *, port: int = 0, ami_validation: bool = True,
                 instance_type_validation: bool = True) -> None:
        self._port = port
        self._ami_validation = ami_validation
        self._type_validation = instance_type_validation
        self._server: Any = None
        self._saved: dict[str, Any] = {}
        self._werkzeug_level: int | None = None
        self._amis: dict[tuple[str, str], str] = {}
        self.endpoint_url = ""

    # dummy keys, only ever handed to boto3 sessions this fixture builds
    @property
    def session_kwargs(self) -> dict[str, str]:
        return dict(DUMMY_CREDENTIALS)

    def start(self) -> MotoEc2:
        if self._server is not None:
            return self
        import moto.settings
        from moto.server import ThreadedMotoServer

        self._saved = {"ENABLE_AMI_VALIDATION": moto.settings.ENABLE_AMI_VALIDATION,
                       "EC2_ENABLE_INSTANCE_TYPE_VALIDATION": moto.settings.EC2_ENABLE_INSTANCE_TYPE_VALIDATION}
        moto.settings.ENABLE_AMI_VALIDATION = self._ami_validation
        moto.settings.EC2_ENABLE_INSTANCE_TYPE_VALIDATION = self._type_validation
        # werkzeug logs every request at INFO; keep a test's output quiet while we run
        wz = logging.getLogger("werkzeug")
        self._werkzeug_level = wz.level
        if wz.level == logging.NOTSET:
            wz.setLevel(logging.WARNING)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=self._port, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        self._server = server
        self.endpoint_url = f"http://{host}:{port}"
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()
            import moto.settings
            for name, value in self._saved.items():
                setattr(moto.settings, name, value)
            if self._werkzeug_level is not None:
                logging.getLogger("werkzeug").setLevel(self._werkzeug_level)

    def __enter__(self) -> MotoEc2:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def reset(self) -> None:
        """Forget every resource in every region (moto's ``POST /moto-api/reset``)."""
        req = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            json.loads(resp.read() or b"{}")
        self._amis.clear()

    def client(self, region: str = "us-east-1", endpoint_url: str | None = None) -> Any:
        """A plain boto3 EC2 client for checking what the provider did."""
        import boto3.session
        import botocore.config

        cfg = botocore.config.Config(retries={"mode": "standard", "total_max_attempts": 1})
        return boto3.session.Session(**self.session_kwargs).client(
            "ec2", region_name=region, endpoint_url=endpoint_url or self.endpoint_url, config=cfg)

    def a_valid_ami(self, region: str = "us-east-1", arch: str = "x86_64") -> str:
        """One of moto's built-in Amazon AMIs in ``region`` for ``arch``."""
        key = (region, arch)
        if key not in self._amis:
            images = self.client(region).describe_images(
                Owners=["amazon"], Filters=[{"Name": "architecture", "Values": [arch]}])["Images"]
            if not images:
                raise LookupError(f"moto has no {arch} AMI in {region}")
            self._amis[key] = sorted(i["ImageId"] for i in images)[0]
        return self._amis[key]

    def provider(self, *, regions: list[str] | None = None, endpoint_url: str | None = None,
                 **kwargs: Any) -> Any:
        """An ``Ec2Provider`` pointed at this server (or at ``endpoint_url``, e.g. a fault
        proxy in front of it), with dummy keys and, unless given, moto's AMI per region."""
        from flowmesh_providers.ec2 import Ec2Provider

        regions = regions or ["us-east-1"]
        if "image_id" not in kwargs:
            kwargs["image_id"] = {r: self.a_valid_ami(r) for r in regions}
        kwargs.setdefault("session_kwargs", self.session_kwargs)
        return Ec2Provider(regions=regions, endpoint_url=endpoint_url or self.endpoint_url, **kwargs)
