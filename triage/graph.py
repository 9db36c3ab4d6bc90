"""The cause graph: incidents, symptoms, causes, probes, evidence and decisions (networkx).

Pure: built from an incident record (the dict `kb.repo.files.load_record` returns, the same
shape as an incident file's front matter), exported to DOT for the UI and summarised
for the diagnosis.

Node ids are namespaced strings (`cause:reasoning-exhausts-budget`, `evidence:E4`, ...) so
that several incidents can share one graph (family links) without clashes.
"""

from __future__ import annotations

import re
import textwrap
from collections import Counter
from collections.abc import Callable
from typing import Any

import networkx as nx

from kb.domain.diagnosis import GraphSummary
from kb.jsontypes import JsonObject

STATUS_COLOURS = {
    "confirmed": "#c0392b",
    "suspected": "#e67e22",
    "rejected": "#616a6b",
}
# (fill, font) of each kind of node: every pair has a WCAG contrast ratio of at least 4.5
# (AA for normal text; tests compute it from the DOT). White on orange (2.9) and on the
# old grey (3.5) were not readable.
DARK_TEXT = "#1d232a"
STATUS_FONTS = {"confirmed": "#ffffff", "suspected": DARK_TEXT, "rejected": "#ffffff"}
KIND_COLOURS = {
    "incident": ("#2c3e50", "#ffffff"),
    "probe": ("#d6eaf8", DARK_TEXT),
    "decision": ("#f1c40f", DARK_TEXT),
}
DEFAULT_COLOURS = ("#ffffff", DARK_TEXT)
KIND_SHAPES = {
    "incident": "doubleoctagon",
    "catalogue": "box",
    "symptom": "box",
    "cause": "box",
    "probe": "box",
    "evidence": "note",
    "decision": "component",
}
EDGE_STYLES = {
    "explains": "solid",
    "supports": "solid",
    "refutes": "dashed",
    "context": "dotted",
    "tested-by": "dotted",
    "same-family": "bold",
    "decided": "solid",
    "observed": "solid",
    "measured": "dotted",
}
LABEL_WIDTH = 16  # characters per line of a node label: narrow nodes keep the graph narrow
LABELLED_RELATIONS = {"supports", "refutes", "tested-by", "same-family"}


def _prefix(slug: str, local: bool) -> str:
    return "" if local else f"{slug}/"


def build_graph(record: JsonObject, *, local_ids: bool = True) -> nx.MultiDiGraph:
    """The cause graph of one incident record."""
    graph: nx.MultiDiGraph = nx.MultiDiGraph()
    add_incident(graph, record, local_ids=local_ids)
    return graph


def add_incident(graph: nx.MultiDiGraph, record: JsonObject, *, local_ids: bool) -> str:
    """Add one incident's nodes and edges; returns the incident node id."""
    slug = str(record.get("slug", "incident"))
    p = _prefix(slug, local_ids)
    incident_node = f"incident:{slug}"
    graph.add_node(
        incident_node,
        kind="incident",
        label=_short(record.get("title", slug), 48),
        status=str(record.get("status", "")),
    )
    evidence_ids = {str(e.get("id")) for e in record.get("evidence") or []}

    def evidence_node(key: str) -> str:
        node = f"{p}evidence:{key}"
        if node not in graph:
            item = next((e for e in record.get("evidence") or [] if str(e.get("id")) == key), None)
            graph.add_node(
                node,
                kind="evidence",
                label=f"{key}: {_short((item or {}).get('summary', ''))}",
                evidence_kind=str((item or {}).get("kind", "")),
            )
        return node

    for symptom in record.get("symptoms") or []:
        node = f"{p}symptom:{symptom.get('id')}"
        graph.add_node(node, kind="symptom", label=_short(symptom.get("description", "")))
        graph.add_edge(incident_node, node, relation="observed")
        for key in symptom.get("evidence") or []:
            if key in evidence_ids:
                graph.add_edge(evidence_node(key), node, relation="supports")

    for cause in record.get("causes") or []:
        _add_cause(graph, record, cause, p, incident_node, evidence_ids, evidence_node)

    _add_arms(graph, record, p, incident_node, evidence_node)

    for index, decision in enumerate(record.get("decisions") or []):
        node = f"{p}decision:{index + 1}"
        graph.add_node(
            node,
            kind="decision",
            label=f"{decision.get('kind')} {str(decision.get('at', ''))[:10]}",
            decision=str(decision.get("kind", "")),
        )
        graph.add_edge(incident_node, node, relation="decided")

    for link in record.get("family") or []:
        other = f"{link.get('incident')}/cause:{link.get('other_cause')}"
        if local_ids and other not in graph:
            graph.add_node(
                other,
                kind="cause",
                label=f"{link.get('other_cause')} ({link.get('incident')})",
                status="",
                external=True,
            )
        graph.add_edge(f"{p}cause:{link.get('cause')}", other, relation="same-family")
    return incident_node


def _add_cause(
    graph: nx.MultiDiGraph,
    record: JsonObject,
    cause: JsonObject,  # one of the incident file's `causes`, as in the file
    p: str,
    incident_node: str,
    evidence_ids: set[str],
    evidence_node: Callable[[str], str],
) -> None:
    """One cause node: what it explains, its evidence links and its deciding probe."""
    node = f"{p}cause:{cause.get('id')}"
    graph.add_node(
        node,
        kind="cause",
        label=str(cause.get("title") or cause.get("id")),
        status=str(cause.get("status", "")),
        basis=str(cause.get("basis", "")),
        catalogue=str(cause.get("catalogue", cause.get("id"))),
    )
    if cause.get("status") != "rejected":
        for symptom in record.get("symptoms") or []:
            graph.add_edge(node, f"{p}symptom:{symptom.get('id')}", relation="explains")
    if not record.get("symptoms"):
        graph.add_edge(node, incident_node, relation="explains")
    parent = cause.get("catalogue")
    if parent and parent != cause.get("id"):
        parent_node = f"{p}cause:{parent}"
        if parent_node not in graph:  # the catalogue cause it refines, when not on record
            graph.add_node(parent_node, kind="catalogue", label=f"catalogue: {parent}")
        graph.add_edge(node, parent_node, relation="context")
    for link in cause.get("evidence") or []:
        key = str(link.get("id"))
        if key not in evidence_ids:
            continue
        relation = str(link.get("relation", "context"))
        graph.add_edge(evidence_node(key), node, relation=relation)
    deciding = str(cause.get("deciding_probe") or "")
    arm_names = {arm["evidence_id"]: str(arm["arm"]) for arm in arm_summaries(record)}
    cited = {
        arm_names[str(link.get("id"))]
        for link in cause.get("evidence") or []
        if str(link.get("id")) in arm_names
    }
    if deciding and deciding not in cited:
        probe = f"{p}probe:{deciding}"
        if probe not in graph:
            graph.add_node(probe, kind="probe", label=deciding)
        graph.add_edge(node, probe, relation="tested-by")


def _add_arms(
    graph: nx.MultiDiGraph,
    record: JsonObject,
    p: str,
    incident_node: str,
    evidence_node: Callable[[str], str],
) -> None:
    """Probe-arm nodes, each attached to the causes whose evidence cites it (the arm decides
    them: `supports` or `refutes`); an arm that decides no cause hangs off the incident."""
    arms = arm_summaries(record)
    names = Counter(str(arm["arm"]) for arm in arms)
    for arm in arms:
        # An arm measured twice (two runs, or a run resumed) is two nodes, each with its
        # own numbers and evidence id, never one node with one run's label.
        repeated = names[str(arm["arm"])] > 1
        probe = f"{p}probe:{arm['arm']}" + (f"@{arm['evidence_id']}" if repeated else "")
        label = f"{arm['arm']}: {arm.get('failures')}/{arm.get('n')} failed"
        if repeated:
            label += f" ({arm['evidence_id']})"
        graph.add_node(probe, kind="probe", label=label, decision=str(arm.get("decision", "")))
        graph.add_edge(probe, evidence_node(arm["evidence_id"]), relation="supports")
        decides = [
            (str(cause.get("id")), str(link.get("relation", "supports")))
            for cause in record.get("causes") or []
            for link in cause.get("evidence") or []
            if str(link.get("id")) == arm["evidence_id"]
        ]
        for cause_id, relation in decides:
            graph.add_edge(probe, f"{p}cause:{cause_id}", relation=relation)
        if not decides:
            graph.add_edge(incident_node, probe, relation="measured")


def arm_summaries(record: JsonObject) -> list[JsonObject]:
    """Probe-arm summaries recorded by the engine (evidence payload type `arm`, as stored,
    plus its evidence id)."""
    arms = []
    for item in record.get("evidence") or []:
        payload = item.get("payload") or {}
        if payload.get("type") == "arm" and payload.get("arm"):
            arms.append({**payload, "evidence_id": str(item.get("id"))})
    return arms


def _short(text: Any, limit: int = 60) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _dot_quote(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


_LONG_WORD_BREAK = re.compile(r"(?<=[-_])")


def _wrap(label: str) -> str:
    """A node label wrapped to LABEL_WIDTH characters per line (newlines; `\\n` in DOT).

    Whole words: the lines joined with spaces give the label back -- except a word longer
    than a line (an incident slug, a snake_case name), which is broken after its hyphens
    and underscores: one 60-character slug on one line made the whole graph
    wider, and the page scales a wide graph down until its labels are unreadable."""
    lines: list[str] = []
    for line in textwrap.wrap(label, LABEL_WIDTH, break_long_words=False, break_on_hyphens=False):
        if len(line) <= LABEL_WIDTH:
            lines.append(line)
            continue
        current = ""
        for part in _LONG_WORD_BREAK.split(line):
            if current and len(current) + len(part) > LABEL_WIDTH:
                lines.append(current)
                current = ""
            current += part
        if current:
            lines.append(current)
    return "\n".join(lines) or label


def to_dot(graph: nx.MultiDiGraph) -> str:
    """Graphviz DOT text; every label is quoted, so user text cannot inject DOT or HTML."""
    lines = [
        "digraph cause_graph {",
        "  rankdir=LR;",
        "  nodesep=0.2; ranksep=0.35;",
        '  node [fontname="Helvetica", fontsize=18, style="rounded,filled", '
        f'fillcolor="{DEFAULT_COLOURS[0]}", fontcolor="{DEFAULT_COLOURS[1]}", '
        'margin="0.1,0.05"];',
        '  edge [fontname="Helvetica", fontsize=14];',
    ]
    for node, data in sorted(graph.nodes(data=True)):
        kind = str(data.get("kind", ""))
        attrs = {
            "label": _wrap(str(data.get("label", node))),
            "shape": KIND_SHAPES.get(kind, "ellipse"),
        }
        status = str(data.get("status", ""))
        if kind == "cause" and status in STATUS_COLOURS:
            attrs["fillcolor"] = STATUS_COLOURS[status]
            attrs["fontcolor"] = STATUS_FONTS[status]
        elif kind in KIND_COLOURS:
            attrs["fillcolor"], attrs["fontcolor"] = KIND_COLOURS[kind]
        rendered = ", ".join(f"{k}={_dot_quote(v)}" for k, v in attrs.items())
        lines.append(f"  {_dot_quote(str(node))} [{rendered}];")
    for source, target, data in sorted(
        graph.edges(data=True), key=lambda e: (str(e[0]), str(e[1]), str(e[2]))
    ):
        relation = str(data.get("relation", ""))
        style = EDGE_STYLES.get(relation, "solid")
        # Only the relations a reader must tell apart are written on the edge; the rest
        # (explains, observed, decided, measured, context) would only widen the graph.
        label = relation if relation in LABELLED_RELATIONS else ""
        lines.append(
            f"  {_dot_quote(str(source))} -> {_dot_quote(str(target))} "
            f"[label={_dot_quote(label)}, style={_dot_quote(style)}];"
        )
    lines.append("}")
    return "\n".join(lines) + "\n"


def summary(graph: nx.MultiDiGraph) -> GraphSummary:
    """Counts for the diagnosis JSON: nodes by kind, edges by relation, causes by status."""
    nodes = Counter(str(d.get("kind", "")) for _, d in graph.nodes(data=True))
    edges = Counter(str(d.get("relation", "")) for _, _, d in graph.edges(data=True))
    statuses = Counter(
        str(d.get("status", ""))
        for _, d in graph.nodes(data=True)
        if d.get("kind") == "cause" and not d.get("external")
    )
    return GraphSummary(
        nodes=graph.number_of_nodes(),
        edges=graph.number_of_edges(),
        nodes_by_kind=dict(sorted(nodes.items())),
        edges_by_relation=dict(sorted(edges.items())),
        causes_by_status=dict(sorted(statuses.items())),
    )
