"""One configuration (flowmesh_sdk.settings): the precedence file < environment <
argument, where each value came from, redaction of secrets in ``flowmesh config show``,
clear errors for bad values, and the SDK's readers (home, catalog, providers) using it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flowmesh_sdk import settings
from flowmesh_sdk.catalog.loader import cache_dir, max_age_days
from flowmesh_sdk.config import home_dir
from flowmesh_sdk.errors import SpecError

SECRET = "vast-key-do-not-print-7c1e"
ENV_SECRET = "alibaba-secret-do-not-print-99a0"


@pytest.fixture
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for s in settings.SETTINGS:
        for var in s.env:
            monkeypatch.delenv(var, raising=False)
    path = tmp_path / "etc" / "flowmesh.toml"
    path.parent.mkdir()
    path.write_text(f"""
home = "{tmp_path / 'home-from-file'}"
cache_dir = "{tmp_path / 'cache-from-file'}"
[catalog]
max_age_days = 7
[log]
level = "info"
[providers.ec2]
image_id = "ami-from-file"
endpoint_url = "http://127.0.0.1:5999"
[providers.vast]
api_key = "{SECRET}"
[providers.ssh]
inventory = "/nonexistent/hosts.json"
surprise = 3
""")
    monkeypatch.setenv("FLOWMESH_CONFIG", str(path))
    return path


def test_precedence_file_then_env_then_argument(cfg: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    r = settings.resolve("providers.ec2.image_id")
    assert (r.value, r.source) == ("ami-from-file", f"file {cfg}")
    monkeypatch.setenv("FLOWMESH_EC2_AMI", "ami-from-env")
    r = settings.resolve("providers.ec2.image_id")
    assert (r.value, r.source) == ("ami-from-env", "env FLOWMESH_EC2_AMI")
    r = settings.resolve("providers.ec2.image_id", "ami-from-arg")
    assert (r.value, r.source) == ("ami-from-arg", "argument")
    monkeypatch.setenv("FLOWMESH_EC2_AMI", "")            # an empty variable is not a value
    assert settings.resolve("providers.ec2.image_id").source == f"file {cfg}"
    # typed: a number from the file, then from the environment
    assert settings.value("catalog.max_age_days") == 7.0 and max_age_days() == 7.0
    monkeypatch.setenv("FLOWMESH_CATALOG_MAX_AGE_DAYS", "365")
    assert max_age_days() == 365.0
    # defaults when neither says anything
    assert settings.resolve("providers.gce.project").source == "unset"
    assert settings.resolve("log.json").value is False and settings.resolve("log.json").source == "default"


def test_the_sdk_reads_its_settings(cfg: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert home_dir() == tmp_path / "home-from-file" and home_dir().is_dir()
    assert cache_dir() == tmp_path / "cache-from-file" / "catalog"
    monkeypatch.setenv("FLOWMESH_HOME", str(tmp_path / "home-from-env"))
    assert home_dir() == tmp_path / "home-from-env"
    from flowmesh_providers.ec2 import Ec2Provider
    p = Ec2Provider(regions=["us-east-1"])
    try:
        assert p.endpoint_url == "http://127.0.0.1:5999"
    finally:
        import asyncio
        asyncio.run(p.close())
    from flowmesh_providers.ssh import SshProvider
    with pytest.raises(SpecError, match="/nonexistent/hosts.json"):
        SshProvider()                                      # the file's inventory is the one it opens


def test_bad_values_name_the_key_and_where(cfg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWMESH_CATALOG_MAX_AGE_DAYS", "soon")
    with pytest.raises(SpecError, match=r"catalog\.max_age_days.*FLOWMESH_CATALOG_MAX_AGE_DAYS.*number"):
        max_age_days()
    monkeypatch.setenv("FLOWMESH_CATALOG_MAX_AGE_DAYS", "-1")
    with pytest.raises(SpecError, match=r"must be > 0"):
        max_age_days()
    with pytest.raises(SpecError, match="unknown setting"):
        settings.resolve("providers.ec2.nope")
    cfg.write_text("home = [1, 2]\n")
    with pytest.raises(SpecError, match=r"home.*must be a string"):
        settings.value("home")
    cfg.write_text("not toml = = =\n")
    with pytest.raises(SpecError, match="not a readable TOML"):
        settings.value("home")
    monkeypatch.setenv("FLOWMESH_CONFIG", str(cfg.parent / "missing.toml"))
    with pytest.raises(SpecError, match="does not exist"):
        settings.value("home")


def test_config_show_says_where_each_came_from_and_redacts_secrets(cfg: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()}
    env.update(FLOWMESH_CONFIG=str(cfg), FLOWMESH_EC2_AMI="ami-from-env",
               ALIBABA_CLOUD_ACCESS_KEY_SECRET=ENV_SECRET)
    res = subprocess.run([sys.executable, "-m", "flowmesh_sdk", "config", "show", "--json"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert SECRET not in res.stdout + res.stderr and ENV_SECRET not in res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["schema"] == "flowmesh.config.show/1" and doc["file"] == str(cfg) and doc["file_exists"]
    rows = {r["key"]: r for r in doc["settings"]}
    assert rows["providers.ec2.image_id"] == {"key": "providers.ec2.image_id", "value": "ami-from-env",
                                              "source": "env FLOWMESH_EC2_AMI", "secret": False, "redacted": False}
    assert rows["providers.vast.api_key"]["value"] == "***" and rows["providers.vast.api_key"]["source"] == f"file {cfg}"
    assert rows["providers.alibaba.access_key_secret"]["value"] == "***"
    assert rows["providers.alibaba.access_key_secret"]["source"] == "env ALIBABA_CLOUD_ACCESS_KEY_SECRET"
    assert rows["catalog.max_age_days"]["value"] == 7.0
    assert rows["providers.gce.project"]["source"] == "unset"
    assert "unknown key" in rows["providers.ssh.surprise"]["source"]
    table = subprocess.run([sys.executable, "-m", "flowmesh_sdk", "config", "show"], capture_output=True,
                           text=True, env=env, timeout=60)
    assert table.returncode == 0 and SECRET not in table.stdout and ENV_SECRET not in table.stdout
    assert "env FLOWMESH_EC2_AMI" in table.stdout and "***" in table.stdout
