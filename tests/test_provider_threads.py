"""One HTTP provider used from several threads: each thread's run owns its own connections."""

from __future__ import annotations

import asyncio
import threading
import time

from batchjson.testing import HttpFaults, LoopbackServer
from batchjson.testing.simulated import SimulatedModel
from tests.helpers import items_call, openai, upper


def test_finishing_a_run_in_one_thread_leaves_another_threads_calls_alone():
    # the first request is held for two seconds; the second is answered at once
    faults = HttpFaults(script={1: "timeout"}, hold=2.0)
    with LoopbackServer(SimulatedModel(upper), faults=faults) as srv:
        provider = openai(srv)
        out: dict[str, object] = {}

        def complete(key):
            async def go():
                try:
                    return await provider.complete(items_call())
                finally:
                    await provider.aclose()
            try:
                out[key] = asyncio.run(go())
            except Exception as exc:  # noqa: BLE001 - recorded for the assertion
                out[key] = exc

        other = threading.Thread(target=complete, args=("other",))
        other.start()
        deadline = time.monotonic() + 10
        while srv.requests < 1 and time.monotonic() < deadline:  # the other call is now held
            time.sleep(0.01)
        assert srv.requests == 1
        complete("mine")
        still_held = other.is_alive()  # mine opened, answered and closed meanwhile
        other.join(10)
    assert still_held
    assert not isinstance(out["mine"], Exception)
    # the other thread gets the server's answer (the held 504), not a connection closed under it
    assert getattr(out["other"], "status", None) == 504
