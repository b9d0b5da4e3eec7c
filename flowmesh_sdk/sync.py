"""A thin synchronous facade for scripts: the async API run on a private event loop
in a background thread.

    from flowmesh_sdk.sync import SyncFleet
    with SyncFleet() as fleet:
        pool = fleet.pool(name="eval", mode="persistent", instance=InstanceSpec(cpus=2, memory_gb=4))
        with pool.sandbox(image="localhost/flowmesh/swe-base:bookworm") as sb:
            print(sb.exec("python3 -V").stdout)

Ctrl-C (``KeyboardInterrupt``) while a call waits cancels the coroutine it runs on the
facade's loop and waits for that coroutine's own cleanup (a sandbox closed, a slot
released) before re-raising; leaving the ``with`` block then drains and closes the fleet.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import signal
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from .errors import SpecError
from .fleet import Fleet
from .pools.auto import AutoPool, AutoStats
from .pools.base import Pool, PoolStats
from .sandbox import DEFAULT_OUTPUT_CAP, FILE_CAP, Process, ProcessStream, Sandbox, Session
from .specs import ExecResult, PoolSpec, SandboxSpec, Task, TaskResult

T = TypeVar("T")
# how long a cancelled call may take to clean up after Ctrl-C before the interrupt goes on
CANCEL_CLEANUP_S = 60.0


class _Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="flowmesh-sync", daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for it.  A ``KeyboardInterrupt`` (or any other
        exception raised into this thread while it waits) cancels the coroutine, waits up to
        :data:`CANCEL_CLEANUP_S` for it to unwind, and is then re-raised."""
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        tasks: list[asyncio.Task[T]] = []

        def copy(task: asyncio.Task[T]) -> None:
            if task.cancelled():
                done.cancel()
            elif task.exception() is not None:
                done.set_exception(task.exception())
            else:
                done.set_result(task.result())

        def start() -> None:
            task = self.loop.create_task(coro)
            tasks.append(task)
            task.add_done_callback(copy)

        def cancel() -> None:
            for task in tasks:
                task.cancel()
            if not tasks:          # never started: close the coroutine so it does not leak
                coro.close()
                done.cancel()

        self.loop.call_soon_threadsafe(start)
        try:
            return done.result()
        except BaseException:
            if done.done():
                raise            # the coroutine's own error (or its own cancellation)
            # interrupted while waiting (Ctrl-C): cancel the coroutine, let it clean up
            self.loop.call_soon_threadsafe(cancel)
            try:
                done.exception(timeout=CANCEL_CLEANUP_S)
            except (concurrent.futures.CancelledError, concurrent.futures.TimeoutError):
                pass
            raise

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


class SyncSandbox:
    def __init__(self, loop: _Loop, sandbox: Sandbox) -> None:
        self._loop = loop
        self.sandbox = sandbox

    def exec(self, cmd: str, *, timeout_s: float | None = None, env: Mapping[str, str] | None = None,
             cwd: str | None = None, output_cap: int = DEFAULT_OUTPUT_CAP, binary: bool = False) -> ExecResult:
        return self._loop.call(self.sandbox.exec(cmd, timeout_s=timeout_s, env=env, cwd=cwd,
                                                 output_cap=output_cap, binary=binary))

    def read_file(self, path: str, *, max_bytes: int = FILE_CAP) -> bytes:
        return self._loop.call(self.sandbox.read_file(path, max_bytes=max_bytes))

    def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        self._loop.call(self.sandbox.write_file(path, data, mode=mode))

    def upload(self, local_dir: str, remote_dir: str) -> None:
        self._loop.call(self.sandbox.upload(local_dir, remote_dir))

    def download(self, remote_path: str, local_dir: str) -> None:
        self._loop.call(self.sandbox.download(remote_path, local_dir))

    def session(self, name: str = "main", *, shell: str | None = None,
                env: Mapping[str, str] | None = None, cwd: str | None = None) -> SyncSession:
        """:meth:`Sandbox.session` (its shell starts on the first ``run``)."""
        return SyncSession(self._loop, self.sandbox.session(name, shell=shell, env=env, cwd=cwd))

    def start(self, cmd: str, *, timeout_s: float | None = None, env: Mapping[str, str] | None = None,
              cwd: str | None = None, output_cap: int = DEFAULT_OUTPUT_CAP, binary: bool = False
              ) -> SyncProcess:
        """:meth:`Sandbox.start`: a background process."""
        return SyncProcess(self._loop, self._loop.call(self.sandbox.start(
            cmd, timeout_s=timeout_s, env=env, cwd=cwd, output_cap=output_cap, binary=binary)))

    def snapshot(self, registry: str | None = None, *, tls_verify: bool | None = None) -> str:
        return self._loop.call(self.sandbox.snapshot(registry, tls_verify=tls_verify))


class SyncSession:
    """:class:`~flowmesh_sdk.sandbox.Session` for scripts."""

    def __init__(self, loop: _Loop, session: Session) -> None:
        self._loop = loop
        self.session = session

    def run(self, cmd: str, *, timeout_s: float | None = None, output_cap: int = DEFAULT_OUTPUT_CAP,
            binary: bool = False) -> ExecResult:
        return self._loop.call(self.session.run(cmd, timeout_s=timeout_s, output_cap=output_cap,
                                                binary=binary))

    def interrupt(self) -> None:
        """SIGINT to the running command (from another thread than the one in ``run``)."""
        self._loop.call(self.session.interrupt())

    def close(self) -> None:
        self._loop.call(self.session.close())


class SyncProcess:
    """:class:`~flowmesh_sdk.sandbox.Process` for scripts: ``for chunk in proc.stdout``."""

    def __init__(self, loop: _Loop, proc: Process) -> None:
        self._loop = loop
        self.process = proc

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    @property
    def stdout(self) -> Iterator[bytes]:
        return self._chunks(self.process.stdout)

    @property
    def stderr(self) -> Iterator[bytes]:
        return self._chunks(self.process.stderr)

    def _chunks(self, stream: ProcessStream) -> Iterator[bytes]:
        it = aiter(stream)
        while True:
            try:
                yield self._loop.call(_next_chunk(it))
            except StopAsyncIteration:
                return

    def wait(self, timeout_s: float | None = None) -> ExecResult:
        return self._loop.call(self.process.wait(timeout_s))

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self._loop.call(_awaited(self.process, sig))

    def write_stdin(self, data: bytes | str) -> None:
        self._loop.call(self.process.write_stdin(data))

    def close_stdin(self) -> None:
        self._loop.call(self.process.close_stdin())


async def _awaited(proc: Process, sig: int) -> None:
    await proc.kill(sig)


async def _next_chunk(it: AsyncIterator[bytes]) -> bytes:
    """``anext(it)`` as a coroutine, which is what :meth:`_Loop.call` runs (StopAsyncIteration
    at the end passes through)."""
    return await anext(it)


class SyncPool:
    def __init__(self, loop: _Loop, pool: Pool) -> None:
        self._loop = loop
        self.pool = pool

    @contextlib.contextmanager
    def sandbox(self, spec: SandboxSpec | None = None, *, image: str | None = None,
                tenant: str = "default", name: str | None = None,
                isolation: str | None = None) -> Iterator[SyncSandbox]:
        """``isolation`` is for a ``mode="auto"`` pool (strict | shared)."""
        cm: contextlib.AbstractAsyncContextManager[Sandbox]
        if isolation is not None:
            if not isinstance(self.pool, AutoPool):
                raise SpecError("isolation", "is for a mode='auto' pool; this pool's mode is "
                                             f"{self.pool.spec.mode.value}")
            cm = self.pool.sandbox(spec, image=image, tenant=tenant, name=name, isolation=isolation)
        else:
            cm = self.pool.sandbox(spec, image=image, tenant=tenant, name=name)
        sb = self._loop.call(cm.__aenter__())
        try:
            yield SyncSandbox(self._loop, sb)
        except BaseException as exc:
            if not self._loop.call(cm.__aexit__(type(exc), exc, exc.__traceback__)):
                raise
        else:
            self._loop.call(cm.__aexit__(None, None, None))

    def run_task(self, task: Task) -> TaskResult:
        return self._loop.call(self.pool.run_task(task))

    def map(self, tasks: Iterable[Task], *,
            on_result: Callable[[TaskResult], None] | None = None) -> list[TaskResult]:
        """``on_result`` runs on the facade's loop thread as each task finishes."""
        return self._loop.call(self.pool.map(list(tasks), on_result=on_result))

    def default_sandbox(self, image: str) -> SandboxSpec:
        return self.pool.default_sandbox(image)

    def stats(self) -> PoolStats | AutoStats:
        return self.pool.stats()

    def drain(self, timeout_s: float | None = None) -> None:
        self._loop.call(self.pool.drain(timeout_s))


class SyncFleet:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loop = _Loop()

        async def make() -> Fleet:
            return Fleet(*args, **kwargs)
        try:
            self.fleet = self._loop.call(make())
        except BaseException:
            self._loop.stop()
            raise

    def pool(self, spec: PoolSpec | None = None, **kwargs: Any) -> SyncPool:
        return SyncPool(self._loop, self._loop.call(self.fleet.pool(spec, **kwargs)))

    def close(self, timeout_s: float | None = None) -> None:
        try:
            self._loop.call(self.fleet.close(timeout_s))
        finally:
            self._loop.stop()

    def __enter__(self) -> SyncFleet:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(None if exc_type is None else 0)   # as Fleet's __aexit__
