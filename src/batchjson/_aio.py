"""Run a coroutine to completion from sync code, even where an event loop already runs."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_sync(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """asyncio.run when no loop runs here; otherwise a worker thread with its own loop.

    Jupyter runs cells inside a live loop, so a nested asyncio.run would fail. In the worker
    case a KeyboardInterrupt in the caller's thread cancels the work and waits for it to
    unwind, so in-flight receipts are closed before the interrupt propagates.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    box: dict[str, Any] = {}
    started = threading.Event()
    done = threading.Event()  # not Thread.join: an interrupted join marks a live thread stopped

    def worker() -> None:
        loop = asyncio.new_event_loop()
        box["loop"] = loop
        try:
            task = loop.create_task(make())
            box["task"] = task
            started.set()
            box["result"] = loop.run_until_complete(task)
        except BaseException as exc:  # handed back to the caller's thread
            box["error"] = exc
        finally:
            started.set()
            loop.close()
            done.set()

    thread = threading.Thread(target=worker, name="batchjson-run", daemon=True)
    thread.start()
    try:
        while not done.wait(0.05):
            pass
    except KeyboardInterrupt:
        started.wait()
        loop, task = box.get("loop"), box.get("task")
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop finished and closed meanwhile
                pass
        done.wait()
        raise
    if "error" in box:
        error = box["error"]
        if isinstance(error, asyncio.CancelledError):
            raise KeyboardInterrupt from error
        raise error
    return box["result"]
