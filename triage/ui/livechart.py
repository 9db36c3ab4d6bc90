"""The Live page's failure-rate chart: one series per model x signature, drawn with a point
at every bucket (a window whose exchanges all fall in one bucket is one point per series,
which a line alone never shows), and legend labels that tell the series apart even when the
model names share a long prefix (the legend used to cut both to the same text)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import altair as alt
import pandas as pd

from kb.service import SeriesPoint

LABEL_LIMIT = 48  # characters of a legend label


def _model_name(model: str) -> str:
    """A model's short name: the file name without directories and `.gguf`."""
    name = os.path.basename(model.rstrip("/")) or model or "unknown model"
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


def _cut(text: str, limit: int) -> str:
    """`text` within `limit` characters, keeping its head and its tail (where model names
    differ: size, quantisation) around an ellipsis."""
    if len(text) <= limit:
        return text
    head = (limit - 1) // 2
    tail = limit - 1 - head
    return f"{text[:head]}…{text[-tail:]}"


def series_labels(
    series: Sequence[tuple[str, str]], limit: int = LABEL_LIMIT
) -> dict[tuple[str, str], str]:
    """A distinct legend label of at most `limit` characters for each (model, signature):
    `signature · model`, the model shortened around its middle; when two labels still
    collide, a number is added."""
    labels: dict[tuple[str, str], str] = {}
    taken: set[str] = set()
    for model, signature in dict.fromkeys(series):
        room = max(limit - len(signature) - 3, 12)
        label = _cut(f"{signature} · {_cut(_model_name(model), room)}", limit)
        base, n = label, 1
        while label in taken:
            n += 1
            label = f"{_cut(base, limit - len(str(n)) - 3)} ({n})"
        taken.add(label)
        labels[(model, signature)] = label
    return labels


def rate_frame(points: Sequence[SeriesPoint]) -> pd.DataFrame:
    """One row per bucket and series: time, series label, rate, k and n."""
    labels = series_labels([(p.model, p.signature) for p in points])
    return pd.DataFrame(
        {
            "time": [p.bucket for p in points],
            "series": [labels[(p.model, p.signature)] for p in points],
            "rate": [p.failures / p.n if p.n else 0.0 for p in points],
            "k/n": [f"{p.failures}/{p.n}" for p in points],
        }
    )


def rate_chart(frame: pd.DataFrame) -> alt.Chart:
    """Lines with a filled point per bucket; the legend shows whole labels."""
    chart: alt.Chart = (
        alt.Chart(frame)
        .mark_line(point=alt.OverlayMarkDef(filled=True, size=80))
        .encode(
            x=alt.X("time:T", title="time (UTC)"),
            y=alt.Y("rate:Q", title="failure rate", scale=alt.Scale(domain=[0, 1])),
            color=alt.Color(
                "series:N",
                title="signature · model",
                legend=alt.Legend(orient="bottom", columns=1, labelLimit=0),
            ),
            tooltip=["time:T", "series:N", "k/n:N", alt.Tooltip("rate:Q", format=".0%")],
        )
    )
    return chart
