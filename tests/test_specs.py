import pytest

from flowmesh_sdk import InstanceSpec, PoolSpec, SandboxSpec, SpecError, Task
from flowmesh_sdk.errors import (AuthError, CapacityError, FlowMeshError, ImageNotFoundError,
                                 NotFoundError, ProviderError, QuotaError, ThrottledError)


@pytest.mark.parametrize("kwargs, field, allowed", [
    ({"cpus": 0}, "instance.cpus", "[1, 1024]"),
    ({"cpus": 2.5}, "instance.cpus", "integer"),
    ({"memory_gb": -1}, "instance.memory_gb", "(0, 32768]"),
    ({"gpus": 17}, "instance.gpus", "[0, 16]"),
    ({"arch": "sparc"}, "instance.arch", "x86_64, arm64"),
    ({"gpu_name": "H100"}, "instance.gpu_name", "gpus >= 1"),
])
def test_instance_spec_names_field_and_range(kwargs, field, allowed):
    with pytest.raises(SpecError) as ei:
        InstanceSpec(**kwargs)
    assert ei.value.field == field
    assert str(ei.value).startswith(field + ":")
    assert allowed in str(ei.value)


@pytest.mark.parametrize("kwargs, field", [
    ({"image": ""}, "sandbox.image"),
    ({"image": "a b"}, "sandbox.image"),
    ({"image": "x", "timeout_s": -1}, "sandbox.timeout_s"),
    ({"image": "x", "timeout_s": float("inf")}, "sandbox.timeout_s"),
    ({"image": "x", "pids": 2}, "sandbox.pids"),
    ({"image": "x", "cpus": 0}, "sandbox.cpus"),
    ({"image": "x", "network": "yes"}, "sandbox.network"),
    ({"image": "x", "workdir": "rel"}, "sandbox.workdir"),
    ({"image": "x", "env": {"1BAD": "v"}}, "sandbox.env['1BAD']"),
    ({"image": "x", "env": {"K": 3}}, "sandbox.env[K]"),
])
def test_sandbox_spec_rejects(kwargs, field):
    with pytest.raises(SpecError) as ei:
        SandboxSpec(**kwargs)
    assert ei.value.field == field


def test_sandbox_defaults_network_off_and_env_hidden_from_repr():
    spec = SandboxSpec(image="img", env={"API_KEY": "s3cr3t-value"})
    assert spec.network is False
    assert "s3cr3t-value" not in repr(spec)
    assert spec.env["API_KEY"] == "s3cr3t-value"
    with pytest.raises(TypeError):
        spec.env["X"] = "y"  # read-only


@pytest.mark.parametrize("kwargs, field", [
    ({"name": "Bad_Name"}, "pool.name"),
    ({"name": "p", "mode": "sometimes"}, "pool.mode"),
    ({"name": "p", "min_instances": 3, "max_instances": 2}, "pool.min_instances"),
    ({"name": "p", "max_instances": 0}, "pool.max_instances"),
    ({"name": "p", "idle_timeout_s": -5}, "pool.idle_timeout_s"),
    ({"name": "p", "mode": "ephemeral", "min_instances": 1}, "pool.min_instances"),
    ({"name": "p", "warm_per_image": 5, "sandboxes_per_instance": 2}, "pool.warm_per_image"),
])
def test_pool_spec_rejects(kwargs, field):
    with pytest.raises(SpecError) as ei:
        PoolSpec(**kwargs)
    assert ei.value.field == field


def test_pool_spec_mode_from_string_and_fit_check():
    spec = PoolSpec(name="p", mode="persistent", instance=InstanceSpec(cpus=2, memory_gb=4),
                    sandboxes_per_instance=4)
    assert spec.mode.value == "persistent"
    spec.check_fits(SandboxSpec(image="x", cpus=1, memory_gb=1))
    with pytest.raises(SpecError, match="sandbox.memory_gb"):
        spec.check_fits(SandboxSpec(image="x", cpus=1, memory_gb=2))
    with pytest.raises(SpecError, match="sandbox.cpus"):
        spec.check_fits(SandboxSpec(image="x", cpus=3, memory_gb=0.5))


def test_task_validation():
    sb = SandboxSpec(image="x")
    with pytest.raises(SpecError, match="task.files"):
        Task(name="t", sandbox=sb, command="true", files={"relative.txt": b""})
    with pytest.raises(SpecError, match="task.command"):
        Task(name="t", sandbox=sb, command="  ")
    with pytest.raises(SpecError, match="task.timeout_s"):
        Task(name="t", sandbox=sb, command="true", timeout_s=0)


def test_error_tree():
    for cls in (CapacityError, QuotaError, ThrottledError, AuthError, NotFoundError):
        assert issubclass(cls, ProviderError) and issubclass(cls, FlowMeshError)
    assert issubclass(SpecError, FlowMeshError) and issubclass(SpecError, ValueError)
    assert issubclass(ImageNotFoundError, FlowMeshError)
    err = CapacityError("no room", provider="local", code="HostCapacity")
    assert str(err) == "[local] no room (HostCapacity)"


# ---- issue 12: validation at construction for every field a user can pass ----------------

def test_task_sandbox_tenant_and_command_are_checked_at_construction():
    """Defect 8: these used to construct, and pool.map then died with AttributeError."""
    sb = SandboxSpec(image="x")
    cases = [
        (dict(sandbox="localhost/x"), "task.sandbox", "SandboxSpec"),
        (dict(sandbox=None), "task.sandbox", "SandboxSpec"),
        (dict(tenant=42), "task.tenant", "tenant name"),
        (dict(tenant=""), "task.tenant", "tenant name"),
        (dict(tenant="alice\n"), "task.tenant", "tenant name"),
        (dict(command="echo a\x00b"), "task.command", "NUL"),
        (dict(files={"/work/a\x00b": b""}), "task.files", "NUL"),
        (dict(files=[("/a", b"")]), "task.files", "mapping"),
        (dict(name="t\n"), "task.name", "printable"),
    ]
    for kw, field, allowed in cases:
        fields = dict(name="t", sandbox=sb, command="true")
        fields.update(kw)
        with pytest.raises(SpecError) as ei:
            Task(**fields)
        assert ei.value.field.startswith(field), kw
        assert allowed in str(ei.value), kw
    assert Task(name="t", sandbox=sb, command="true", tenant="team-a@corp").tenant == "team-a@corp"


def test_warm_images_must_be_a_tuple_of_valid_references():
    """Defect 9: a string was split into one-character images; bad references passed."""
    with pytest.raises(SpecError) as ei:
        PoolSpec(name="p", warm_images="localhost/x")
    assert ei.value.field == "pool.warm_images" and "('localhost/x',)" in str(ei.value)
    with pytest.raises(SpecError) as ei:
        PoolSpec(name="p", warm_images=("localhost/ok", "Bad Image"))
    assert ei.value.field == "pool.warm_images[1]"
    with pytest.raises(SpecError) as ei:
        PoolSpec(name="p", warm_images=5)
    assert ei.value.field == "pool.warm_images"
    assert PoolSpec(name="p", warm_images=["localhost/x:1"]).warm_images == ("localhost/x:1",)


@pytest.mark.parametrize("make", [
    lambda: PoolSpec(name="eval\n"),
    lambda: SandboxSpec(image="x", env={"KEY\n": "v"}),
    lambda: SandboxSpec(image="x:latest\n"),
    lambda: SandboxSpec(image="localhost/x@sha256:" + "a" * 64 + "\n"),
])
def test_a_trailing_newline_is_refused(make):
    """Defect 10: ``re.match`` with ``$`` accepted a trailing newline."""
    with pytest.raises(SpecError):
        make()


def test_fleet_name_with_a_trailing_newline_is_refused(tmp_path):
    from flowmesh_sdk import Fleet
    with pytest.raises(SpecError) as ei:
        Fleet("crash\n", home=tmp_path)
    assert ei.value.field == "fleet.name"


@pytest.mark.parametrize("kwargs, field, allowed", [
    ({"cpus": 0.001}, "sandbox.cpus", "[0.01, 1024]"),
    ({"cpus": 0.009}, "sandbox.cpus", "[0.01, 1024]"),
    ({"memory_gb": 0.004}, "sandbox.memory_gb", "at least 6 MiB"),
    ({"env": ["K=v"]}, "sandbox.env", "mapping"),
    ({"env": "K=v"}, "sandbox.env", "mapping"),
    ({"workdir": "/work\x00/x"}, "sandbox.workdir", "no NUL"),
    ({"workdir": "work"}, "sandbox.workdir", "absolute"),
    ({"workdir": None}, "sandbox.workdir", "absolute"),
])
def test_sandbox_ranges_match_what_the_runtime_accepts(kwargs, field, allowed):
    """Defect 11: values the runtime refuses are refused at construction, by field."""
    with pytest.raises(SpecError) as ei:
        SandboxSpec(image="x", **kwargs)
    assert ei.value.field == field
    assert allowed in str(ei.value)


def test_the_smallest_allowed_sandbox_is_accepted():
    spec = SandboxSpec(image="x", cpus=0.01, memory_gb=6 / 1024)
    assert spec.memory_mib == 6


def test_instance_gpu_name_must_be_a_name():
    with pytest.raises(SpecError) as ei:
        InstanceSpec(gpus=1, gpu_name=7)
    assert ei.value.field == "instance.gpu_name"
