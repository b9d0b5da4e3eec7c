"""SSH input a user (or an attacker writing an inventory) might give, on real OpenSSH sshd
hosts on loopback addresses: host and user names OpenSSH's ssh refuses on its command line,
an ssh config whose ProxyCommand needs a shell, ssh configs the SDK cannot apply, and a
connection that dies under a running command.  Only the SDK's errors may come out."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("fabric")

from flowmesh_sdk.errors import FlowMeshError, ProviderUnavailableError, SpecError  # noqa: E402
from flowmesh_sdk.remote.keys import host_id  # noqa: E402
from flowmesh_sdk.remote.ssh import SshRunner, SshTarget  # noqa: E402
from flowmesh_sdk.testing.sshd import LoopbackSshd  # noqa: E402

from flowmesh_providers.ssh import SshHost, SshProvider, load_inventory  # noqa: E402

# what OpenSSH 9.6's valid_hostname refuses (and a user part valid_ruser refuses)
REFUSED_HOSTS = ["-oProxyCommand=touch /tmp/pwned", "-box", "lab box", "box\n", "a\tb", "a\x00b", "a\x7fb",
                 "a\u2028b", "a;b", "a|b", "a`id`", "$(id)", "a$b", "a&b", "a<b", "a>b", "a'b", 'a"b',
                 "a\\b", "a(b", "a{b", "a,b", "", "alice@-box", "-alice@box", "a;b@box", "box:ssh", ":22"]
# what it lets through: IPv6 literals, scopes, user@ and host:port (fabric's shorthand),
# ssh config wildcards, non-ASCII names
ALLOWED_HOSTS = ["::1", "fe80::1%eth0", "10.0.0.5", "box.lab.example", "alice@box", "box:2222", "gpu-*",
                 "under_score", "bücher.example"]


@pytest.mark.parametrize("host", REFUSED_HOSTS)
def test_host_names_openssh_refuses_are_refused_at_construction(host):
    with pytest.raises(SpecError) as ei:
        SshTarget(host)
    assert ei.value.field == "ssh.host" and "must be" in str(ei.value)
    with pytest.raises(SpecError) as ei:
        SshHost(name="box", host=host or "-", cpus=1, memory_gb=1)
    assert ei.value.field == "ssh.hosts[box].host"


@pytest.mark.parametrize("host", ALLOWED_HOSTS)
def test_host_names_openssh_accepts_are_accepted(host):
    assert SshTarget(host).host == host
    assert SshHost(name="box", host=host, cpus=1, memory_gb=1).host == host


@pytest.mark.parametrize("user, ok", [("-oProxyCommand=x", False), ("a;b", False), ("a\nb", False),
                                      ("a -b", False), ("a`b", False), ("x\\", False), ("", False),
                                      ("ubuntu", True), ("DOMAIN\\alice", True), ("first.last", True)])
def test_user_names_as_openssh_checks_them(user, ok, tmp_path):
    if ok:
        assert SshTarget("box", user=user).user == user
        return
    with pytest.raises(SpecError) as ei:
        SshTarget("box", user=user)
    assert ei.value.field == "ssh.user"
    inv = tmp_path / "inv.json"
    inv.write_text(json.dumps({"hosts": [{"name": "box", "user": user, "cpus": 1, "memory_gb": 1}]}))
    with pytest.raises(SpecError) as ei:
        load_inventory(inv)
    assert ei.value.field == "ssh.hosts[box].user"


def _known_hosts(path: Path, d: LoopbackSshd) -> Path:
    path.write_text(f"{host_id(d.host, d.port)} {d.host_public_key}\n")
    return path


async def test_a_config_alias_beginning_with_a_dash_is_never_connected_to(tmp_path, fm_home):
    with LoopbackSshd("127.0.0.71") as d:
        cfg = tmp_path / "ssh_config"
        cfg.write_text(f"Host -box\n    HostName {d.host}\n    Port {d.port}\n    User root\n"
                       f"    IdentityFile {d.client_key_path}\n"
                       f"    UserKnownHostsFile {_known_hosts(tmp_path / 'known_hosts', d)}\n")
        with pytest.raises(SpecError) as ei:
            runner = SshRunner(SshTarget("-box", ssh_config=str(cfg)))
            await runner.run(["touch", str(tmp_path / "ran")], timeout_s=20)
        assert ei.value.field == "ssh.host"
        with pytest.raises(SpecError) as ei:
            prov = SshProvider([SshHost(name="box", host="-box", cpus=1, memory_gb=1)],
                               state_dir=fm_home / "ssh", ssh_config=cfg)
            await prov._runner_for("box").run(["touch", str(tmp_path / "ran")], timeout_s=20)
        assert ei.value.field == "ssh.hosts[box].host"
        assert not (tmp_path / "ran").exists() and d.accepted_logins() == 0


RELAY = r'''
import json, os, socket, sys, threading
host, port, user, alias, percent, mark = sys.argv[1:]     # exactly these: no "2>/dev/null" here
with open(os.environ["FM_RELAY_LOG"], "a") as f:
    f.write(json.dumps({"argv": sys.argv[1:], "pid": os.getpid()}) + "\n")
print("relay: connecting", file=sys.stderr)
s = socket.create_connection((host, int(port)))
def up():
    while data := os.read(0, 65536):
        s.sendall(data)
    s.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while data := s.recv(65536):
    os.write(1, data)
'''


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z"


async def test_a_proxycommand_with_shell_syntax_runs_as_openssh_runs_it(tmp_path, monkeypatch):
    relay = tmp_path / "relay.py"
    relay.write_text(RELAY)
    log, shell_log = tmp_path / "relay.log", tmp_path / "shell.log"
    shell = tmp_path / "shell"     # the user's $SHELL: records how it was called, then is /bin/sh
    shell.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {shell_log}\nexec /bin/sh "$@"\n')
    shell.chmod(0o755)
    monkeypatch.setenv("SHELL", str(shell))
    monkeypatch.setenv("FM_RELAY_LOG", str(log))
    monkeypatch.setenv("FM_MARK", "two words")
    with LoopbackSshd("127.0.0.72") as d:
        cfg = tmp_path / "ssh_config"
        cfg.write_text(f"Host lab-proxied\n    HostName {d.host}\n    Port {d.port}\n    User root\n"
                       f"    IdentityFile {d.client_key_path}\n"
                       f"    UserKnownHostsFile {_known_hosts(tmp_path / 'known_hosts', d)}\n"
                       f'    ProxyCommand {sys.executable} {relay} %h %p %r %n 100%% "$FM_MARK" 2>/dev/null\n')
        runner = SshRunner(SshTarget("lab-proxied", ssh_config=str(cfg)))
        try:
            r = await runner.run(["sh", "-c", "echo $SSH_CONNECTION"], timeout_s=30)
            assert r.ok, r.describe()
            assert r.stdout.split()[2:] == [d.host.encode(), str(d.port).encode()]
            assert (await runner.run(["echo", "again"], timeout_s=30)).stdout == b"again\n"
        finally:
            await runner.close()
        (rec,) = [json.loads(line) for line in log.read_text().splitlines()]   # one connection
        assert rec["argv"] == [d.host, str(d.port), "root", "lab-proxied", "100%", "two words"]
        assert shell_log.read_text().splitlines()[:2] == [
            "-c", f'exec {sys.executable} {relay} {d.host} {d.port} root lab-proxied 100% "$FM_MARK" 2>/dev/null']
        assert _gone(rec["pid"])   # closing the runner ended the ProxyCommand


async def test_a_failing_proxycommand_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("SHELL", "")   # unset or empty: /bin/sh, as OpenSSH
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host lab-down\n    HostName 127.0.0.73\n    ConnectTimeout 5\n"
                   "    ProxyCommand sh -c 'echo no route to %h >&2; exit 3'\n")
    runner = SshRunner(SshTarget("lab-down", ssh_config=str(cfg)))
    with pytest.raises(ProviderUnavailableError) as ei:
        await runner.run(["true"], timeout_s=20)
    assert "exited with 3" in str(ei.value) and "no route to 127.0.0.73" in str(ei.value)
    await runner.close()


async def test_a_whitespace_host_under_a_proxycommand_config_is_a_spec_error_not_a_keyerror(tmp_path):
    # fabric's own ProxyCommand builds "Host lab box" from the host and looks "lab box" up in it
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host *\n    ProxyCommand nc %h %p 2>/dev/null\n")
    with pytest.raises(SpecError) as ei:
        runner = SshRunner(SshTarget("lab box", ssh_config=str(cfg)))
        await runner.run(["true"], timeout_s=10)
    assert ei.value.field == "ssh.host"


@pytest.mark.parametrize("config, field", [
    (None, "ssh.ssh_config"),                                           # the file is not there
    ('Host "unclosed\n    User root\n', "ssh.ssh_config"),              # paramiko cannot parse it
    ("Host box\n    Port twenty-two\n", "ssh.ssh_config"),              # no port number
    ("Host box\n    ProxyCommand nc %x %p\n", "ssh.ssh_config"),        # a token OpenSSH refuses
    ("Host box\n    ProxyCommand nc %h %p 100%\n", "ssh.ssh_config"),   # a lone % at the end
])
async def test_an_ssh_config_the_sdk_cannot_apply_is_a_spec_error(tmp_path, config, field):
    cfg = tmp_path / "ssh_config"
    if config is not None:
        cfg.write_text(config)
    runner = SshRunner(SshTarget("box", ssh_config=str(cfg)))
    with pytest.raises(FlowMeshError) as ei:
        await runner.run(["true"], timeout_s=10)
    assert isinstance(ei.value, SpecError) and ei.value.field == field, repr(ei.value)
    assert ei.value.__cause__ is not None or "ProxyCommand" in str(ei.value)
    await runner.close()


async def test_a_connection_lost_under_a_command_is_an_error_not_an_exit_code(tmp_path):
    with LoopbackSshd("127.0.0.74") as d:
        started = tmp_path / "started"
        os.mkfifo(started)
        runner = SshRunner(SshTarget(d.host, d.port, "root", d.client_key_path, d.host_public_key,
                                     ssh_config=""))
        try:
            task = asyncio.create_task(runner.run(["sh", "-c", f"echo up > {started}; exec sleep 60"],
                                                  timeout_s=120))
            assert await asyncio.wait_for(asyncio.to_thread(started.read_text), 30) == "up\n"
            await asyncio.to_thread(d.stop)        # kills the listener and every session's sshd
            with pytest.raises(ProviderUnavailableError) as ei:
                await asyncio.wait_for(task, 30)
            assert ei.value.code == "ConnectionLost" and "connection was lost" in str(ei.value)
            # a command killed by a signal is still a result (sshd ended its channel)
            d.start()
            r = await runner.run(["sh", "-c", "kill -KILL $$"], timeout_s=30)
            assert not r.ok and not r.timed_out
            assert (await runner.run(["echo", "back"], timeout_s=30)).stdout == b"back\n"
            assert runner.connects == 2
        finally:
            await runner.close()
