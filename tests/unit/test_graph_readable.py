"""Issue 28 item 10: the cause graph's labels are readable -- every node's text colour on its
fill meets WCAG AA (4.5:1), computed from the DOT attributes; no label line is wider than
LABEL_WIDTH (a 60-character slug on one line widened the whole graph until the page scaled
it to 9 px labels); and an arm measured twice is two nodes, never one with one run's label.
The rendered size is checked in Chromium: tests/browser/test_ui_graph_browser.py."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from kb.repo.files import import_paths, load_record
from kb.repo.store import Store
from triage.graph import LABEL_WIDTH, build_graph, to_dot

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "browser"))
from bigrecord import record as large_record  # noqa: E402

INCIDENTS = Path(__file__).resolve().parents[2] / "incidents"
NODE = re.compile(r'^  ("(?:[^"\\]|\\.)*") \[(.*)\];$', re.M)
ATTR = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _luminance(colour: str) -> float:
    value = colour.lstrip("#")
    channels = [int(value[i : i + 2], 16) / 255 for i in (0, 2, 4)]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(a: str, b: str) -> float:
    high, low = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def nodes(dot: str) -> dict[str, dict[str, str]]:
    """Every node's attributes, the `node [...]` defaults filled in."""
    defaults = dict(ATTR.findall(re.search(r"^  node \[(.*)\];$", dot, re.M).group(1)))  # type: ignore[union-attr]
    return {name: {**defaults, **dict(ATTR.findall(attrs))} for name, attrs in NODE.findall(dot)}


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    store = Store("sqlite://")
    try:
        import_paths(store, [INCIDENTS])
        with store.session(readonly=True) as session:
            return load_record(session, "2026-06-10-gemma4-empty-response")
    finally:
        store.close()


@pytest.mark.parametrize("which", ["reference", "large"])
def test_every_label_colour_meets_aa_contrast_on_its_fill(
    which: str, reference: dict[str, Any]
) -> None:
    record = reference if which == "reference" else large_record()
    found = nodes(to_dot(build_graph(record)))
    assert len(found) > 10
    statuses = {attrs.get("fillcolor") for attrs in found.values()}
    assert len(statuses) >= 4  # confirmed, suspected, rejected, probes... all checked
    weak = {
        name: (
            attrs["fontcolor"],
            attrs["fillcolor"],
            round(contrast(attrs["fontcolor"], attrs["fillcolor"]), 2),
        )
        for name, attrs in found.items()
        if contrast(attrs["fontcolor"], attrs["fillcolor"]) < 4.5
    }
    assert weak == {}


def test_no_label_line_is_wider_than_a_node(reference: dict[str, Any]) -> None:
    found = nodes(to_dot(build_graph(reference)))
    labels = [attrs["label"].replace('\\"', '"') for attrs in found.values()]
    lines = [line for label in labels for line in label.split("\\n")]
    assert max(len(line) for line in lines) <= LABEL_WIDTH, max(lines, key=len)
    family = next(a["label"] for n, a in found.items() if "qwen-echo" in n)
    # The slug is broken after hyphens, and nothing of it is lost.
    assert family.replace("\\n", "") == (
        "reasoning-exhausts-budget(2026-05-01-qwen-echo-response-latency)"
    )


def test_an_arm_measured_twice_is_two_nodes_with_their_own_numbers() -> None:
    record = large_record()
    again = dict(record["evidence"][0])
    again["id"] = "E40"
    again["payload"] = {**again["payload"], "n": 8, "failures": 8}
    record["evidence"].append(again)
    graph = build_graph(record)
    probes = {
        node: data["label"]
        for node, data in graph.nodes(data=True)
        if data.get("kind") == "probe" and str(node).startswith("probe:thinking-off")
    }
    assert sorted(probes.values()) == [
        "thinking-off: 1/16 failed (E1)",
        "thinking-off: 8/8 failed (E40)",
    ]
