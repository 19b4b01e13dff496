"""The one bridge from sync code to async: a background event loop, one per Session and one shared
(:func:`run_sync`). Jupyter's live loop forbids a nested ``asyncio.run``, and a loop per run would
throw away the providers' connection pools (docs/design.md, "One event loop per Session")."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ._errors import InvalidBatch

T = TypeVar("T")

# Blocking providers run in the loop's executor: the default (cpu + 4) caps 2 cores at 6 calls.
EXECUTOR_THREADS = 64


class BackgroundLoop:
    """A daemon thread running one event loop until :meth:`close`."""

    def __init__(self, name: str = "batchjson-loop") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if (self._loop is not None and not self._loop.is_closed() and self._thread is not None
                    and self._thread.is_alive()):  # a forked child has the loop, not its thread
                return self._loop
            loop = asyncio.new_event_loop()
            self._executor = concurrent.futures.ThreadPoolExecutor(
                EXECUTOR_THREADS, thread_name_prefix=f"{self._name}-call")
            loop.set_default_executor(self._executor)
            ready = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                while True:
                    try:
                        loop.run_forever()
                        return  # stopped by close()
                    except (KeyboardInterrupt, SystemExit):  # raised in a task: stored on it
                        continue

            thread = threading.Thread(target=serve, name=self._name, daemon=True)
            self._loop, self._thread = loop, thread
            thread.start()
            ready.wait()
            return loop

    def run(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run ``make()`` on the background loop and wait for it; a KeyboardInterrupt cancels
        the task and waits for it to unwind, so in-flight receipts are closed first."""
        if self._thread is not None and threading.current_thread() is self._thread:
            raise InvalidBatch("a batch cannot be run from inside a provider or validator of "
                               "the same session (its event loop would wait on itself)")
        loop = self._start()
        done = threading.Event()
        box: dict[str, Any] = {}

        def start() -> None:
            if "stopped" in box:  # interrupted before the run began: it never starts
                return
            box["task"] = task = loop.create_task(make())
            task.add_done_callback(lambda _: done.set())

        def stop() -> None:
            box["stopped"] = True
            if "task" in box:
                box["task"].cancel()
            else:
                done.set()

        try:  # the hand-off too: the run may start, and be interrupted, before it returns
            loop.call_soon_threadsafe(start)
            while not done.wait(0.05):  # timed, so that Jupyter's SIGINT is seen
                pass
        except KeyboardInterrupt:
            loop.call_soon_threadsafe(stop)  # runs after start() if start() was queued
            while not done.wait(0.05):
                pass
            raise
        if box["task"].cancelled():
            raise KeyboardInterrupt
        return box["task"].result()  # or raises what the run raised

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the loop's thread while it runs, between its tasks' steps (what they read
        is never changed under them), else here."""
        with self._lock:
            loop, thread = self._loop, self._thread
        if (loop is None or thread is None or thread is threading.current_thread()
                or not thread.is_alive()):
            return fn()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def apply() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread
                future.set_exception(exc)

        try:
            loop.call_soon_threadsafe(apply)
        except RuntimeError:  # closed meanwhile: no task is left to read it
            return fn()
        while True:
            try:
                return future.result(0.05)
            except concurrent.futures.TimeoutError:
                if not thread.is_alive() and not future.done():  # closed before it ran
                    return fn()

    def close(self, finalize: Callable[[], Coroutine[Any, Any, None]] | None = None) -> None:
        """Run ``finalize`` (closing pooled connections) on the loop, then stop it."""
        with self._lock:
            loop, thread, executor = self._loop, self._thread, self._executor
            self._loop = self._thread = self._executor = None
        if loop is None or loop.is_closed():
            return
        inside = thread is threading.current_thread()  # collected on the loop's own thread
        if finalize is not None and thread is not None and thread.is_alive() and not inside:
            with contextlib.suppress(Exception):  # closing connections: best effort at the end
                asyncio.run_coroutine_threadsafe(finalize(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None and not inside:
            thread.join(10)
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)  # a hung blocking call stays
        if not loop.is_running():
            loop.close()


_SHARED = BackgroundLoop("batchjson-sync")


def run_sync(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``make()`` from sync code with no session at hand, on one shared background loop."""
    return _SHARED.run(make)
