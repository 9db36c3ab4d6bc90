"""Progress as typed events: the engine says what happened, with the numbers as fields;
the CLI (triage/commands/engine.py) and the UI (triage/ui/actions.py) render them. Nobody
reads a number back out of a message."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

__all__ = [
    "ArmSkipped",
    "ArmsPlanned",
    "Event",
    "LookStarted",
    "ProgressEvent",
    "ProgressFn",
    "RepliesIn",
]


@dataclass(frozen=True)
class ProgressEvent:
    """A stage and a sentence: launches, crashes, the gate, the end of the run."""

    stage: str
    message: str
    done: int = 0
    total: int = 0
    # An upper bound on the seconds left, from measured replay times (triage.engine.eta);
    # None until a replay has been timed.
    eta: float | None = None


@dataclass(frozen=True)
class ArmsPlanned:
    """The arms this run replays, and the dimensions of a known-good search (if any)."""

    request_arms: int
    server_arms: int
    known_good: tuple[str, ...] = ()
    stage: ClassVar[str] = "plan"
    done: ClassVar[int] = 0
    total: ClassVar[int] = 0
    eta: ClassVar[float | None] = None

    @property
    def message(self) -> str:
        search = f", known-good search over {list(self.known_good)}" if self.known_good else ""
        return f"{self.request_arms} request arms, {self.server_arms} server arms{search}"


@dataclass(frozen=True)
class ArmSkipped:
    """An arm dropped once the observations showed it cannot matter."""

    arm: str
    reason: str
    stage: ClassVar[str] = "plan"
    done: ClassVar[int] = 0
    total: ClassVar[int] = 0
    eta: ClassVar[float | None] = None

    @property
    def message(self) -> str:
        return f"skipped {self.arm}: {self.reason}"


@dataclass(frozen=True)
class LookStarted:
    """Look `done` of `total` begins: `target` replays for each of `arms`."""

    done: int
    total: int
    target: int
    arms: tuple[str, ...]
    eta: float | None = None
    stage: ClassVar[str] = "probe"

    @property
    def message(self) -> str:
        return f"look {self.done}/{self.total}: {self.target} replays for " + ", ".join(self.arms)


@dataclass(frozen=True)
class RepliesIn:
    """Replies came in between looks (a slow server): the arm's counts so far."""

    arm: str
    replies: int
    failing: int
    unanswered: int
    eta: float | None = None
    stage: ClassVar[str] = "probe"
    done: ClassVar[int] = 0
    total: ClassVar[int] = 0

    @property
    def message(self) -> str:
        return (
            f"{self.arm}: {self.replies} replays in ({self.failing} failing, "
            f"{self.unanswered} without an answer)"
        )


Event = ProgressEvent | ArmsPlanned | ArmSkipped | LookStarted | RepliesIn
ProgressFn = Callable[[Event], None]
