"""A fake engine Backend (triage.engine.backend): servers that are records, replies that a
rule decides -- no process, no socket. The engine cannot tell it from LlamaBackend."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from kb.domain.records import Reply
from kb.jsontypes import JsonObject
from triage import probes
from triage.engine.backend import ReplayOptions, Transform
from triage.engine.pacing import PaceOptions
from triage.engine.replayer import ArmRoute
from triage.engine.scheduler import Replayer
from triage.engine.servers import Server
from triage.stackfile import ServerConfig

# (arm, the body the arm sends, the server it goes to, replay index) -> does it fail?
FailRule = Callable[[str, dict[str, Any], Server, int], bool]


def reply(arm: str, index: int, failed: bool, kinds: Sequence[str]) -> Reply:
    finish = "length" if failed and "length-stop" in kinds else "stop"
    return Reply(
        arm, index, 1000 + index, failed, list(kinds) if failed else [], finish, 10, 20, 200,
        0.5, {"predicted_n": 20},
    )  # fmt: skip


class FakeReplayer:
    def __init__(self, request: JsonObject, fails: FailRule, kinds: Sequence[str]) -> None:
        self.request = request
        self.fails = fails
        self.kinds = kinds
        self.routes: dict[str, ArmRoute] = {}
        self.pace_options: PaceOptions | None = None
        self.sent: dict[str, list[int]] = {}

    async def replay(self, arm: str, indices: Sequence[int]) -> list[Reply]:
        route = self.routes[arm]
        body = route.transform(dict(self.request))
        self.sent.setdefault(arm, []).extend(indices)
        return [reply(arm, i, self.fails(arm, body, route.server, i), self.kinds) for i in indices]


class FakeBackend:
    """Every launch succeeds at once; `fails` decides each reply."""

    def __init__(self, fails: FailRule, kinds: Sequence[str] = ("length-stop",)) -> None:
        self.fails = fails
        self.kinds = kinds
        self.launched: list[str] = []
        self.replayers: list[FakeReplayer] = []

    def check_config(self, config: ServerConfig, where: str) -> None:
        return None

    def check_url(self, url: str) -> None:
        return None

    def launch(
        self, config: ServerConfig, log_dir: Path, ready_timeout: float
    ) -> AbstractContextManager[Server]:
        self.launched.append(config.key())
        return _server(config)

    def replayer(self, request: JsonObject, options: ReplayOptions) -> FakeReplayer:
        replayer = FakeReplayer(request, self.fails, self.kinds)
        self.replayers.append(replayer)
        return replayer

    def launch_each_time(
        self,
        config: ServerConfig,
        log_dir: Path,
        request: JsonObject,
        transform: Transform,
        options: ReplayOptions,
    ) -> Replayer:
        raise AssertionError("no crash in this fake")

    async def observe(
        self,
        server: Server,
        request: JsonObject,
        facts: dict[str, dict[str, Any]],
        options: ReplayOptions,
    ) -> None:
        facts["server-props"] = {"name": "server-props", "total_slots": server.slots}

    async def observe_arm(
        self, planned: probes.PlannedArm, context: probes.ObserveContext
    ) -> dict[str, Any] | None:
        return None


@contextmanager
def _server(config: ServerConfig) -> Iterator[Server]:
    yield Server(config.key(), config, f"http://fake.invalid/{config.key()}", 2, 0.0)
