"""Where replies come from: the `Backend` protocol the engine runs against -- launch a
server, replay arms on servers, observe a server -- and `LlamaBackend`, the real one
(llama-server processes and the llama client). Unit tests pass a fake backend; the engine
never knows which it has (encode/httpx's transports)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kb.jsontypes import JsonObject
from triage import observe, probes
from triage.engine.pacing import PaceOptions
from triage.engine.replayer import ArmRoute, LaunchEachTime, LlamaReplayer
from triage.engine.scheduler import Replayer
from triage.engine.servers import Server, check_config, check_url, open_server
from triage.stackfile import ServerConfig

__all__ = ["ArmReplayer", "Backend", "LlamaBackend", "ReplayOptions", "Transform"]

Transform = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class ReplayOptions:
    """How replays are sent: seeds, time limits, requests at once."""

    seed: int
    request_timeout: float
    ready_timeout: float
    concurrency: int | None = None
    pace: PaceOptions | None = None  # None: a fixed `request_timeout` per replay


class ArmReplayer(Replayer, Protocol):
    """A Replayer whose arms are routed to servers (`routes[arm]`) as their servers come up."""

    routes: dict[str, ArmRoute]
    pace_options: PaceOptions | None


class Backend(Protocol):
    """Launch, replay, observe."""

    def check_config(self, config: ServerConfig, where: str) -> None:
        """Refuse (EngineError) a configuration that cannot start, before anything runs."""

    def check_url(self, url: str) -> None:
        """Refuse (EngineError) a running server that does not answer."""

    def launch(
        self, config: ServerConfig, log_dir: Path, ready_timeout: float
    ) -> AbstractContextManager[Server]:
        """Start (or attach to) a server; stopped when the context ends."""

    def replayer(self, request: JsonObject, options: ReplayOptions) -> ArmReplayer:
        """The replayer of a run: each arm's request on the server it is routed to."""

    def launch_each_time(
        self,
        config: ServerConfig,
        log_dir: Path,
        request: JsonObject,
        transform: Transform,
        options: ReplayOptions,
    ) -> Replayer:
        """Crash mode: every replay is a launch of `config` plus one request."""

    async def observe(
        self,
        server: Server,
        request: JsonObject,
        facts: dict[str, dict[str, Any]],
        options: ReplayOptions,
    ) -> None:
        """The server's own facts (props, template render, determinism) into `facts`."""

    async def observe_arm(
        self, planned: probes.PlannedArm, context: probes.ObserveContext
    ) -> dict[str, Any] | None:
        """An arm's observation hook's facts."""


class LlamaBackend:
    """llama-server processes (triage.llama.launcher) and the llama client."""

    def check_config(self, config: ServerConfig, where: str) -> None:
        check_config(config, where)

    def check_url(self, url: str) -> None:
        check_url(url)

    def launch(
        self, config: ServerConfig, log_dir: Path, ready_timeout: float
    ) -> AbstractContextManager[Server]:
        return open_server(config, log_dir, ready_timeout)

    def replayer(self, request: JsonObject, options: ReplayOptions) -> LlamaReplayer:
        return LlamaReplayer(
            request,
            options.seed,
            options.request_timeout,
            options.concurrency,
            pace_options=options.pace,
        )

    def launch_each_time(
        self,
        config: ServerConfig,
        log_dir: Path,
        request: JsonObject,
        transform: Transform,
        options: ReplayOptions,
    ) -> LaunchEachTime:
        return LaunchEachTime(
            config,
            log_dir,
            options.ready_timeout,
            request,
            options.seed,
            options.request_timeout,
            transform,
        )

    async def observe(
        self,
        server: Server,
        request: JsonObject,
        facts: dict[str, dict[str, Any]],
        options: ReplayOptions,
    ) -> None:
        found: dict[str, observe.ServerObservation] = {}
        try:
            await observe.observe_server(
                server, request, found, seed=options.seed, timeout=options.request_timeout
            )
        finally:  # what was observed before an interrupt is kept too
            facts.update((name, dict(fact)) for name, fact in found.items())

    async def observe_arm(
        self, planned: probes.PlannedArm, context: probes.ObserveContext
    ) -> dict[str, Any] | None:
        assert planned.observe is not None
        facts = await planned.observe(context)
        return None if facts is None else dict(facts)
