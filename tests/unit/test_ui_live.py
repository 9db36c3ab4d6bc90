"""The Live page (AppTest): upstream identity, the rate chart per signature, the rates with
their intervals and the incidents the proxy opened."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from kb.domain.live import LiveAlarm
from kb.models import utcnow
from kb.repo import live, liveincidents
from kb.repo.store import Store
from triage.ui import data

REPO = Path(__file__).resolve().parents[2]
APP = str(REPO / "triage" / "ui" / "app.py")


def _row(i: int, signature: str, at: Any) -> dict[str, Any]:
    return {
        "key": f"k{i:04d}",
        "recorded_at": at,
        "model": "gemma-drill.gguf",
        "client": "agent/1",
        "signature": signature,
        "failed": bool(signature),
        "status": 200,
        "upstream_build": "b11434-abc",
        "template_sha256": "f" * 64,
        "findings": signature.split("|")[0].split("+") if signature else [],
    }


@pytest.fixture
def live_kb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    store = Store(url)
    now = utcnow()
    try:
        with store.session() as session:
            rows = [
                _row(i, "empty-content|2xx" if i % 4 == 0 else "", now - timedelta(minutes=i))
                for i in range(40)
            ]
            live.insert_exchanges(session, rows)
            liveincidents.open_incident(
                session,
                LiveAlarm(
                    model="gemma-drill.gguf",
                    signature="empty-content|2xx",
                    kinds=("empty-content",),
                    title="Live: empty-content from gemma-drill.gguf (10/40 failing)",
                    summary="new failure",
                    upstream={"model": "gemma-drill.gguf", "build": "b11434-abc"},
                    detection={"rate": {"failures": 10, "n": 40, "interval": [0.14, 0.4]}},
                    examples=(),
                    opened_by="replica-a",
                ),
            )
    finally:
        store.close()
    monkeypatch.setenv("TRIAGE_DATABASE_URL", url)
    yield url
    data.forget_stores()


def _open_live() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("views/live.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_live_page_shows_identity_chart_rates_and_incidents(live_kb: str) -> None:
    at = _open_live()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics == {
        "Model": "gemma-drill.gguf",
        "Build": "b11434-abc",
        "Chat template": "ffffffffffff",
    }
    charts = at.get("arrow_line_chart") or at.get("vega_lite_chart")
    assert charts, "the failure rates are drawn as a chart"
    (table,) = [df.value for df in at.dataframe]
    assert list(table["k/n"]) == ["10/40"]
    assert list(table["Signature"]) == ["empty-content|2xx"]
    low, high = (float(x.strip().rstrip("%")) for x in table["95% interval"][0].split(" - "))
    assert low < 25.0 < high
    text = " ".join(str(m.value) for m in at.markdown)
    assert "10/40 failing" in text and "replica-a" in text


def test_live_page_without_traffic_says_how_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    Store(url).close()
    monkeypatch.setenv("TRIAGE_DATABASE_URL", url)
    try:
        at = _open_live()
        assert any("triage proxy" in str(i.value) for i in at.info)
    finally:
        data.forget_stores()


LONG = "gemma-4-e2b-it-qat-instruct-experimental-release-candidate"


@pytest.fixture
def one_bucket_kb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Two models whose names differ only at the end, every exchange in the same minute."""
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    store = Store(url)
    now = utcnow() - timedelta(minutes=2)
    try:
        with store.session() as session:
            rows = []
            for i in range(12):
                row = _row(i, "empty-content|2xx" if i % 3 == 0 else "", now)
                row["model"] = f"{LONG}-{'Q4_K_M' if i % 2 else 'Q8_0'}.gguf"
                rows.append(row)
            live.insert_exchanges(session, rows)
    finally:
        store.close()
    monkeypatch.setenv("TRIAGE_DATABASE_URL", url)
    yield url
    data.forget_stores()


def test_a_window_in_one_bucket_draws_points_with_distinct_legend_labels(
    one_bucket_kb: str,
) -> None:
    import json as _json

    import pyarrow as pa

    at = _open_live()
    (chart,) = at.get("arrow_vega_lite_chart") or at.get("vega_lite_chart")
    spec = _json.loads(chart.proto.spec)
    # A line through one bucket draws nothing: each bucket is also a point.
    mark = spec["mark"]
    assert mark["type"] == "line" and mark["point"], mark
    series: set[str] = set()
    for dataset in chart.proto.datasets:  # Arrow IPC bytes of the chart's data
        table = pa.ipc.open_stream(dataset.data.data).read_all()
        series |= set(table.column("series").to_pylist())
    assert len(series) == 2, series
    assert any("Q4_K_M" in label for label in series)
    assert any("Q8_0" in label for label in series)
    assert spec["encoding"]["color"]["legend"]["labelLimit"] == 0
