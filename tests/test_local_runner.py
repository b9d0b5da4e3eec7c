"""The local runner's children are waited for without a thread each (Python 3.11 made one per
child; the runner has it do what 3.12 does), and a watcher the program chose is kept.

Each case runs in an interpreter of its own: the child watcher is the process's."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_CASE = textwrap.dedent('''
    import asyncio, sys, threading
    from flowmesh_sdk.remote.local import LocalRunner

    async def main(choose):
        if choose:
            asyncio.set_child_watcher(asyncio.ThreadedChildWatcher())
        runner = LocalRunner()
        seen = []

        async def look():
            await asyncio.sleep(0.3)   # the commands below are running
            seen.extend(t.name for t in threading.enumerate())

        looking = asyncio.ensure_future(look())
        results = await asyncio.gather(*(runner.run(["sh", "-c", f"sleep 1; exit {i}"], timeout_s=30)
                                          for i in range(4)))
        await looking
        chan = await runner.open_channel(["sh", "-c", "read x; echo got $x"])
        await chan.write(b"it\\n")
        line = await chan.readline()
        await chan.close()
        watcher = type(asyncio.get_child_watcher()).__name__ if sys.version_info < (3, 12) else "-"
        print([r.exit_code for r in results], line, sum(n.startswith("asyncio-waitpid") for n in seen), watcher)

    asyncio.run(main(sys.argv[1] == "chosen"))

    # loops one after another (the synchronous API) and side by side in threads: each waits
    # for its own children
    async def again(code):
        return (await LocalRunner().run(["sh", "-c", f"exit {code}"], timeout_s=30)).exit_code

    later = []
    threads = [threading.Thread(target=lambda c=c: later.append(asyncio.run(again(c)))) for c in (5, 6)]
    for t in threads:
        t.start()
    later.append(asyncio.run(again(7)))
    for t in threads:
        t.join()
    print(sorted(later))
''')


def _case(which: str) -> list[str]:
    res = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-c", _CASE, which],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    first, later = res.stdout.strip().split("\n")
    assert later == "[5, 6, 7]"
    return first.rsplit(" ", 2)


def test_commands_are_waited_for_without_a_thread_each():
    results, threads, watcher = _case("default")
    assert results == "[0, 1, 2, 3] b'got it\\n'"   # exit codes and a channel as before
    assert threads == "0"                            # four commands running, no waiter thread
    assert watcher in ("PidfdWatcher", "-")   # flowmesh_sdk.remote.children's, on 3.11


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12 chooses the watcher itself; 3.14 has none to choose")
def test_a_watcher_the_program_chose_is_kept():
    results, threads, watcher = _case("chosen")
    assert results == "[0, 1, 2, 3] b'got it\\n'"
    assert (threads, watcher) == ("4", "ThreadedChildWatcher")   # its thread per command, as it chose
