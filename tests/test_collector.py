"""The coordinator's garbage-collector thresholds (flowmesh_sdk.collector): raised while a
fleet is open, given back when the last one closes, never lowered, never forced on a
process that chose its own."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowmesh_sdk import Fleet, collector
from flowmesh_sdk.errors import SpecError


@pytest.fixture(autouse=True)
def interpreter_thresholds(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, int, int]]:
    # as in a process where no fleet is open (a fleet an earlier test left open holds them)
    monkeypatch.setattr(collector, "_holders", 0)
    monkeypatch.setattr(collector, "_saved", None)
    monkeypatch.setattr(collector, "_applied", None)
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        yield (700, 10, 10)
    finally:
        gc.set_threshold(*before)


async def test_an_open_fleet_raises_the_thresholds_and_its_close_gives_them_back(tmp_path: Path) -> None:
    fleet = Fleet("gc-one", home=tmp_path, reconcile_interval_s=None)
    assert gc.get_threshold() == (700, 10, 10)        # made, not started: nothing changed yet
    async with fleet:
        assert gc.get_threshold() == (50_000, 20, 10)
    assert gc.get_threshold() == (700, 10, 10)


async def test_the_last_of_two_fleets_gives_them_back(tmp_path: Path) -> None:
    async with Fleet("gc-a", home=tmp_path / "a", reconcile_interval_s=None):
        async with Fleet("gc-b", home=tmp_path / "b", reconcile_interval_s=None):
            assert gc.get_threshold() == (50_000, 20, 10)
        assert gc.get_threshold() == (50_000, 20, 10)   # gc-a is still open
    assert gc.get_threshold() == (700, 10, 10)


async def test_higher_thresholds_and_a_process_own_change_are_left_alone(tmp_path: Path) -> None:
    gc.set_threshold(80_000, 5, 100)
    async with Fleet("gc-high", home=tmp_path / "h", reconcile_interval_s=None):
        assert gc.get_threshold() == (80_000, 20, 100)   # each raised to at least the setting, none lowered
    assert gc.get_threshold() == (80_000, 5, 100)
    gc.set_threshold(700, 10, 10)
    async with Fleet("gc-mine", home=tmp_path / "m", reconcile_interval_s=None):
        gc.set_threshold(2_000, 10, 10)                  # the program changes them while the fleet is open
    assert gc.get_threshold() == (2_000, 10, 10)         # and keeps its own


async def test_off_and_a_disabled_collector_change_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWMESH_GC_THRESHOLD", "off")
    async with Fleet("gc-off", home=tmp_path / "o", reconcile_interval_s=None):
        assert gc.get_threshold() == (700, 10, 10)
    monkeypatch.setenv("FLOWMESH_GC_THRESHOLD", "20000,20,20")
    async with Fleet("gc-env", home=tmp_path / "e", reconcile_interval_s=None):
        assert gc.get_threshold() == (20_000, 20, 20)
    gc.disable()
    try:
        async with Fleet("gc-disabled", home=tmp_path / "d", reconcile_interval_s=None):
            assert gc.get_threshold() == (700, 10, 10) and not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("bad", ["10000", "a,b,c", "10000,-1,10", "1,2,3,4"])
def test_a_bad_setting_names_the_key_and_the_form(bad: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWMESH_GC_THRESHOLD", bad)
    with pytest.raises(SpecError, match=r"coordinator\.gc_threshold.*three positive integers.*FLOWMESH_GC_THRESHOLD"):
        Fleet("gc-bad", home=tmp_path)
    assert collector.parse(" 3000, 20,30 ") == (3000, 20, 30)
