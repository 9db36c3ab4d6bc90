"""The gateway drills on real gateways in front of the real llama-server: nginx (Debian
package) and the LiteLLM proxy (PyPI, its own venv under the cache), each with a read
timeout shorter than the drill's answer. The client's capture through the gateway is the
gateway's error page (never a server crash); the diagnosis confirms gateway-timeout with
the direct arm (k/n, interval), and no other cause; every process is stopped afterwards."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kb.domain.diagnosis import Finding, validate_diagnosis
from kb.repo.store import Store
from triage.drills import build_drill
from triage.drills import gateway as gateway_drill
from triage.drills.gateways import LITELLM_KEY, GatewayError
from triage.engine import DiagnoseOptions, Intake, diagnose
from triage.llama.launcher import running_servers
from triage.stackfile import load_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module", params=[gateway_drill.NGINX, gateway_drill.LITELLM])
def served(
    request: pytest.FixtureRequest, server_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[gateway_drill.Served, dict[str, Any], str]]:
    """Serve the drill (server + gateway), diagnose the client's capture, stop both."""
    name = str(request.param)
    folder = tmp_path_factory.mktemp(name)
    drill = build_drill(name, folder / "drill")
    try:
        context = gateway_drill.serve(drill, folder / "served", server_binary)
        served = context.__enter__()
    except GatewayError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"{name}: the gateway cannot run here: {exc}")
        pytest.skip(f"{name}: the gateway cannot run here: {exc}")
    try:
        store = Store(f"sqlite:///{folder / 'kb.db'}")
        try:
            diagnosis = diagnose(
                store,
                Intake(served.request, exchange=served.exchange, findings=tuple(served.findings)),
                load_stack(served.stack_path),
                options=DiagnoseOptions(max_requests=16, log_dir=folder / "runs"),
            ).to_json()
        finally:
            store.close()
    finally:
        context.__exit__(None, None, None)
    yield served, diagnosis, name


def _failed(findings: list[Finding]) -> set[str]:
    return {f.kind for f in findings if not f.passed}


def test_the_gateway_page_is_a_gateway_error_never_a_server_crash(
    served: tuple[gateway_drill.Served, dict[str, Any], str],
) -> None:
    capture, _, name = served
    kinds = _failed(capture.findings)
    assert "gateway-error" in kinds
    assert not kinds & {"server-crash", "server-hang"}
    assert capture.exchange["status"] == (504 if name == gateway_drill.NGINX else 408)


def test_gateway_timeout_is_confirmed_by_the_direct_arm_and_nothing_else(
    served: tuple[gateway_drill.Served, dict[str, Any], str],
) -> None:
    capture, diagnosis, name = served
    validate_diagnosis(diagnosis)
    causes = {c["id"]: c for c in diagnosis["causes"]}
    arms = {a["name"]: a for a in diagnosis["arms"]}
    verdict = causes["gateway-timeout"]
    assert verdict["status"] == "confirmed", verdict["rationale"]
    assert verdict["deciding_probe"] == "gateway-direct"
    base, direct = arms["baseline"], arms["gateway-direct"]
    assert base["failures"] == base["n"] >= 4  # every request through the gateway fails
    assert direct["failures"] == 0 and direct["n"] >= 4
    assert direct["ci95"][1] < base["ci95"][0]  # the intervals do not overlap
    assert f"{direct['failures']}/{direct['n']}" in verdict["rationale"]
    confirmed = sorted(c for c, v in causes.items() if v["status"] == "confirmed")
    assert confirmed == ["gateway-timeout"]
    if name == gateway_drill.NGINX:
        # nginx ends every request at its proxy_read_timeout, whatever the request variant:
        # the deadline is named with the timeout the drill configured.
        # A deadline is a floor: the failures end at it or, on a busy host, a little later.
        assert "the gateway's read timeout" in verdict["rationale"]
        at = re.search(r"end(?:s)? at (\d+\.\d)\+-", verdict["rationale"])
        assert at is not None, verdict["rationale"]
        assert capture.read_timeout - 0.1 <= float(at.group(1)) <= capture.read_timeout + 0.6
    assert arms["gateway-streamed"]["n"] >= 4  # reported; informational, never decisive


def test_the_gateway_key_stays_out_of_the_diagnosis_and_every_process_stopped(
    served: tuple[gateway_drill.Served, dict[str, Any], str],
) -> None:
    capture, diagnosis, _ = served
    assert LITELLM_KEY not in json.dumps(diagnosis)
    assert running_servers() == []
    with pytest.raises(ProcessLookupError):  # the gateway process is gone (reaped)
        os.kill(int(capture.facts["gateway_pid"]), 0)
