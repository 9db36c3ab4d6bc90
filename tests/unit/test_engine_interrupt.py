"""A Ctrl-C during a diagnosis must stop the run even when a library on the way swallowed
the cancellation asyncio.run's SIGINT handler sent (the run went on and finished as `done`
under load on CI: the interrupted run could not be resumed)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from triage.engine.execute import _stop_if_interrupted


async def _swallowing_step() -> None:
    # The Ctrl-C arrives while the step waits (sent from the loop itself, not after a
    # delay: no race with a busy machine).
    asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGINT)
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        pass  # what a shielded close in an HTTP client can do to a cancellation


async def _run(reached: list[str]) -> str:
    await _swallowing_step()
    reached.append("after the swallowed cancel")
    _stop_if_interrupted()
    reached.append("the next step")  # must not be reached
    return "done"


def test_a_swallowed_ctrl_c_still_interrupts_the_run() -> None:
    reached: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(_run(reached))
    assert reached == ["after the swallowed cancel"]


def test_an_uninterrupted_run_goes_on() -> None:
    async def run() -> str:
        _stop_if_interrupted()
        return "done"

    assert asyncio.run(run()) == "done"
