"""stream-format on the real llama-server: the drill's streamed tool call through the
rewriting proxy breaks the OpenAI chunk format (the function name resent in later deltas,
found per delta in the client's capture); the stream-vs-nonstream observation reproduces it
in the streamed replays, stream:false removes it, llama-server's own streams are well formed,
and no other cause is confirmed. Every process the drill started is stopped."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb.domain.diagnosis import validate_diagnosis
from kb.repo.store import Store
from triage.drills import build_drill
from triage.drills.stream_format import NAME, serve
from triage.engine import DiagnoseOptions, Intake, diagnose
from triage.engine.arms.stream_format import ARM
from triage.llama.launcher import running_servers
from triage.stackfile import load_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def test_deltas_rewritten_by_a_proxy_confirm_stream_format(
    server_binary: Path, tmp_path: Path
) -> None:
    drill = build_drill(NAME, tmp_path / "drill")
    with serve(drill, tmp_path / "served") as served:
        broken = [f for f in served.findings if f.kind == "stream-format-violation"]
        assert broken and not any(f.passed for f in broken)
        assert all("tool-name-repeated" in f.reason for f in broken)
        store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
        try:
            diagnosis = diagnose(
                store,
                Intake(served.request, exchange=served.exchange, findings=tuple(served.findings)),
                load_stack(served.stack_path),
                options=DiagnoseOptions(max_requests=8, log_dir=tmp_path / "runs"),
            ).to_json()
        finally:
            store.close()
        proxy_log = (tmp_path / "served" / "proxy" / "stream-proxy.log").read_text()
    validate_diagnosis(diagnosis)
    causes = {c["id"]: c for c in diagnosis["causes"]}
    verdict = causes["stream-format"]
    assert verdict["status"] == "confirmed" and verdict["deciding_probe"] == ARM
    assert "streamed 8/8" in verdict["rationale"]
    assert "stream:false 0/8" in verdict["rationale"]
    assert "gateway in front rewrites" in verdict["rationale"]
    confirmed = sorted(c for c, v in causes.items() if v["status"] == "confirmed")
    assert confirmed == ["stream-format"]
    assert "POST /v1/chat/completions" in proxy_log  # the replays went through the proxy
    assert running_servers() == []
    assert served.proxy.process.poll() is not None  # the proxy stopped with the block
