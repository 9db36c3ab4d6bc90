"""The run's progress sink and reply journal: typed events out (triage.engine.events),
each look's replies into the knowledge base (through the recorder) as they come in."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kb.domain.records import Reply
from triage.engine.backend import ReplayOptions
from triage.engine.decide import Execution
from triage.engine.eta import eta_bound
from triage.engine.events import Event, LookStarted, RepliesIn
from triage.engine.pacing import PaceOptions
from triage.engine.recorder import Recorder
from triage.engine.servers import scrub_secrets

__all__ = ["QUIET_SECONDS", "ExecuteOptions", "Journal", "Progress"]

QUIET_SECONDS = 30.0  # a progress line at least this often while replies come in


@dataclass(frozen=True)
class ExecuteOptions:
    """What the executor needs of DiagnoseOptions."""

    max_requests: int
    seed: int
    concurrency: int | None
    request_timeout: float
    ready_timeout: float
    divergence_seeds: int
    schedule: tuple[int, ...]
    pace: PaceOptions | None = None  # replay time limits (triage.engine.pacing)
    check_preconditions: bool = True  # False: run arms whose `requires` says they cannot matter

    @property
    def replay(self) -> ReplayOptions:
        return ReplayOptions(
            self.seed, self.request_timeout, self.ready_timeout, self.concurrency, self.pace
        )


class Progress:
    """The progress sink: every event also beats the run's heartbeat (a run that stops
    beating is taken as abandoned); probe events carry the bound on the time left."""

    def __init__(self, fn: Callable[[Event], None], recorder: Recorder, options: ExecuteOptions):
        self.fn = fn
        self.recorder = recorder
        self.options = options
        self.execution: Execution | None = None
        self.last_emit = time.monotonic()

    def emit(self, event: Event) -> None:
        self.recorder.heartbeat()
        self.last_emit = time.monotonic()
        if isinstance(event, LookStarted | RepliesIn):
            event = dataclasses.replace(event, eta=self._eta())
        self.fn(event)

    def _eta(self) -> float | None:
        """The bound on the time left: replays still possible x measured time per replay /
        the replays each server runs at once."""
        if self.execution is None:
            return None
        slots = {
            key: self.options.concurrency or max(1, min(server.slots, 4))
            for key, server in self.execution.servers.items()
        }
        bound = eta_bound(self.execution.arms.values(), self.options.max_requests, slots)
        return None if bound is None else bound.seconds


@dataclass
class Journal:
    """Stores each look's replies as they come in, their error text scrubbed of secret flag
    values (a failed launch quotes its argv); says what came in when a server is slow."""

    recorder: Recorder
    secrets: list[str]
    progress: Progress
    execution: Execution

    def write(self, replies: Sequence[Reply]) -> None:
        if self.secrets:
            replies = [
                dataclasses.replace(r, error=scrub_secrets(r.error, self.secrets)) if r.error else r
                for r in replies
            ]
        self.recorder.record_replies(replies)
        if replies and time.monotonic() - self.progress.last_emit >= QUIET_SECONDS:
            arm = self.execution.arms.get(replies[0].arm)
            if arm is not None:
                self.progress.emit(
                    RepliesIn(arm.name, len(arm.replies), arm.failures, len(arm.replies) - arm.n)
                )
