"""The suite's session-end leak check, a pytest plugin (tests/conftest.py loads it; an
inner session in tests/test_suite_hygiene.py loads it with ``-p _leakcheck``).

At start it tags the session (flowmesh_sdk.testing.hygiene.begin); at the end, after every
fixture's teardown, it lists what the session left -- processes, containers, temporary
directories -- fails the run if anything is, and then removes it, so a developer's machine
does not pile up.  What a concurrent session on this machine may still be using is only
warned about."""

from __future__ import annotations

import sys

import pytest

from flowmesh_sdk.testing import hygiene

_SESSION = pytest.StashKey[hygiene.Session]()


def pytest_configure(config: pytest.Config) -> None:
    if _SESSION not in config.stash:
        config.stash[_SESSION] = hygiene.begin()


@pytest.hookimpl(trylast=True)   # after the runner's own sessionfinish has torn down every fixture
def pytest_sessionfinish(session: pytest.Session) -> None:
    started = session.config.stash.get(_SESSION, None)
    if started is None:
        return
    found = hygiene.leftovers(started)
    tr = session.config.pluginmanager.get_plugin("terminalreporter")

    def say(title: str, lines: list[str], **markup: bool) -> None:
        if tr is not None:
            tr.write_line("")   # end the progress line
            tr.write_sep("=", title, **markup)
            for line in lines:
                tr.write_line(line, **markup)
        else:
            print("\n".join([title, *lines]), file=sys.stderr)

    if found.unsure:
        say("leak check: not counted, another test session's maybe", found.unsure, yellow=True)
    if found:
        say("leak check: the test session left these behind (now removed)", found.lines(), red=True)
        hygiene.clean(found)
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
