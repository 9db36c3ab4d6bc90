"""Incident: the diagnosis, probe arms, cause graph, history, references, and the forms."""

from __future__ import annotations

import json
from typing import TypedDict

import altair as alt
import pandas as pd
import streamlit as st

from kb.domain.triggers import stored_trigger
from kb.jsontypes import JsonObject
from triage.atlas.report import record_matches
from triage.graph import arm_summaries, build_graph, summary, to_dot
from triage.ui import data, nav
from triage.ui.incident_forms import STATUS_ORDER, decision_form, override_form
from triage.ui.runs import (
    ALL_RUNS,
    IncidentRuns,
    load_runs,
    record_for_run,
    run_verdicts,
    unexplained_parts,
)
from triage.ui.text import markdown_to_html, md_escape, md_link

STATUS_ICONS = {  # Material icons: the emoji are missing from many server fonts
    "confirmed": ":red[:material/check_circle:]",
    "suspected": ":orange[:material/help:]",
    "rejected": ":gray[:material/cancel:]",
}
STATUS_MEANING = {
    "confirmed": "the evidence on record shows it",
    "suspected": "neither shown nor ruled out yet",
    "rejected": "the evidence on record rules it out",
}

store = data.get_store()


def pick_incident() -> str | None:
    """The incident in the URL (?slug=...), else the most recent one (None: there is none)."""
    slug = st.query_params.get("slug")
    if slug:
        return str(slug)
    recent = data.recent_incidents(store, limit=1)
    if not recent:
        st.title("Incident")
        st.info("No incidents in the knowledge base yet.")
        st.page_link(nav.NEW_TRIAGE, label="Start a new triage", icon=":material/add_circle:")
        return None
    st.caption("No incident in the address: showing the most recent one.")
    st.page_link(nav.INCIDENTS, label="All incidents", icon=":material/list:")
    return recent[0][0]


def pick_run(runs: IncidentRuns) -> int | None:
    """The run the Diagnosis, Probe arms and Cause graph tabs show: the latest by default,
    or ALL_RUNS; None when the incident has no engine runs (imported from a file)."""
    if not runs.runs:
        return None
    options = [run.id for run in runs.runs] + [ALL_RUNS]
    return int(
        st.selectbox(
            "Engine run shown in Diagnosis, Probe arms and Cause graph",
            options,
            format_func=runs.label,
            key="run_pick",
        )
    )


def evidence_index(record: JsonObject) -> dict[str, JsonObject]:
    return {str(item.get("id")): item for item in record.get("evidence") or []}


def arm_line(payload: JsonObject) -> str:
    ci = payload.get("ci95") or [None, None]
    p_value = payload.get("p_value")
    parts = [
        f"arm {payload.get('arm')} ({payload.get('variant', '')})",
        f"{payload.get('failures')}/{payload.get('n')} failed",
    ]
    if isinstance(payload.get("rate"), (int, float)):
        parts.append(f"rate {payload['rate']:.3f}")
    if ci and ci[0] is not None:
        parts.append(f"95% CI [{float(ci[0]):.3f}, {float(ci[1]):.3f}]")
    if isinstance(p_value, (int, float)):
        parts.append(f"p = {p_value:.3g}")
    if payload.get("decision"):
        parts.append(f"-> {payload['decision']}")
    return " · ".join(parts)


def show_evidence(item: JsonObject, *, relation: str = "", note: str = "") -> None:
    """One piece of evidence: summary, numbers, the probe arm, the raw (redacted) payload."""
    payload = item.get("payload") or {}
    head = f"**{md_escape(item.get('id'))}** · {md_escape(item.get('kind', ''))}"
    if relation:
        head += f" · _{md_escape(relation)}_"
    st.markdown(f"{head} -- {md_escape(item.get('summary', ''))}")
    if note:
        st.caption(md_escape(note))
    if payload.get("type") == "arm":
        st.caption(md_escape(arm_line(payload)))
    if item.get("source") or item.get("recorded_at"):
        st.caption(
            md_escape(f"source: {item.get('source') or '-'} · recorded {item.get('recorded_at')}")
        )
    if payload:
        # st.json renders a JSON tree (text only): numbers, arms and redacted exchanges.
        # Collapsed: one line per payload, opened on demand (27 open payloads made the
        # Diagnosis tab 16,000 px tall).
        st.json(payload, expanded=False)


def header(record: JsonObject) -> None:
    st.title(md_escape(record.get("title", record["slug"])))
    stack = record.get("stack") or {}
    facts = [
        f"**{md_escape(record['slug'])}**",
        f"status **{md_escape(record.get('status', ''))}**",
        f"opened {md_escape(record.get('opened', ''))}",
    ]
    if record.get("closed"):
        facts.append(f"closed {md_escape(record['closed'])}")
    st.markdown(" · ".join(facts))
    parked = data.incident_parked_state(store, record["slug"])
    if parked is not None and parked.due:
        st.error(
            f"**OVERDUE** ({parked.state}) -- {md_escape('; '.join(parked.reasons))}",
            icon=":material/alarm:",
        )
    decisions = record.get("decisions") or []
    if decisions:
        latest = decisions[-1]
        line = f"**{latest.get('kind')}** {md_escape(str(latest.get('at', ''))[:10])}"
        if latest.get("by"):
            line += f" by {md_escape(latest['by'])}"
        line += f" -- {md_escape(latest.get('rationale', ''))}"
        if latest.get("revisit_on"):
            line += f"  \nRevisit on {md_escape(latest['revisit_on'])}"
        if latest.get("triggers"):
            line += "  \nTriggers: " + md_escape(
                "; ".join(data.describe_trigger(stored_trigger(t)) for t in latest["triggers"])
            )
        st.info(line, icon=":material/gavel:")
    with st.expander("Summary, impact and stack", expanded=False):
        if record.get("summary"):
            st.markdown(md_escape(record["summary"]))
        if record.get("impact"):
            st.markdown(f"**Impact:** {md_escape(record['impact'])}")
        columns = st.columns(4)
        for column, (label, key) in zip(
            columns,
            [
                ("Model", "model"),
                ("Weights", "weights"),
                ("Server build", "server_build"),
                ("Flags", "flags"),
            ],
            strict=True,
        ):
            value = stack.get(key)
            if isinstance(value, list):
                value = " ".join(str(v) for v in value)
            column.caption(label)
            column.text(str(value or "-"))
        extra = {
            k: v for k, v in stack.items() if k not in {"model", "weights", "server_build", "flags"}
        }
        if extra:
            st.caption(md_escape(", ".join(f"{k}: {v}" for k, v in extra.items())))


def findings_table(symptoms: list[JsonObject]) -> None:
    """The incident's findings, one row each (nothing when there are none)."""
    if not symptoms:
        return
    st.subheader("Findings")
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "Id": s.get("id"),
                    "Kind": s.get("kind", ""),
                    "Description": s.get("description", ""),
                    "Observed": json.dumps(s.get("observed") or {}, ensure_ascii=False),
                    "Evidence": ", ".join(s.get("evidence") or []),
                }
                for s in symptoms
            ]
        ),
        hide_index=True,
        width="stretch",
        key="findings_table",
    )


def diagnosis_tab(record: JsonObject, verdicts: dict[str, str] | None = None) -> None:
    """The findings and causes; `verdicts` (cause -> status) adds what the shown run said."""
    causes = record.get("causes") or []
    evidence = evidence_index(record)
    findings_table(record.get("symptoms") or [])
    st.subheader("Causes")
    if not causes:
        st.info("No candidate causes recorded.")
        return
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "Status": c.get("status"),
                    "Cause": c.get("id"),
                    "Title": c.get("title", ""),
                    "Basis": c.get("basis", ""),
                    "Deciding probe": c.get("deciding_probe", ""),
                    "Evidence": ", ".join(str(link.get("id")) for link in c.get("evidence") or []),
                    **({"This run": verdicts.get(str(c.get("id")), "-")} if verdicts else {}),
                }
                for status in STATUS_ORDER
                for c in causes
                if c.get("status") == status
            ]
        ),
        hide_index=True,
        width="stretch",
        key="causes_table",
    )
    for status in STATUS_ORDER:
        group = [c for c in causes if c.get("status") == status]
        if not group:
            continue
        st.markdown(
            f"#### {STATUS_ICONS[status]} {status.capitalize()} ({len(group)})  \n"
            f"_{STATUS_MEANING[status]}_"
        )
        for cause in group:
            title = md_escape(cause.get("title", cause.get("id")))
            label = f"{title} · {md_escape(cause.get('basis', ''))}"
            with st.expander(label, expanded=status == "confirmed"):
                st.markdown(
                    f"**{md_escape(cause.get('id'))}** (catalogue "
                    f"{md_escape(cause.get('catalogue', cause.get('id')))}) -- "
                    f"**{status}**, basis **{md_escape(cause.get('basis', ''))}**"
                )
                if cause.get("rationale"):
                    st.markdown(md_escape(cause["rationale"]))
                if cause.get("deciding_probe"):
                    st.caption(md_escape(f"deciding probe: {cause['deciding_probe']}"))
                links = cause.get("evidence") or []
                if not links:
                    st.caption("No evidence linked.")
                for link in links:
                    item = evidence.get(str(link.get("id")))
                    if item is None:
                        st.warning(f"evidence {md_escape(link.get('id'))} is missing")
                        continue
                    show_evidence(
                        item, relation=str(link.get("relation", "")), note=str(link.get("note", ""))
                    )


def arms_tab(
    record: JsonObject, runs: IncidentRuns | None = None, run_id: int | None = None
) -> None:
    """The arms of the chosen run (with a Run column and the latest run charted when all
    runs are chosen)."""
    runs = runs or IncidentRuns()
    every = run_id == ALL_RUNS
    arms = arm_summaries(record if every else record_for_run(record, runs, run_id))
    if not arms:
        st.info("No probe arms recorded for this incident (the engine records them when it runs).")
        return
    rows = []
    for arm in arms:
        ci = arm.get("ci95") or [None, None]
        rows.append(
            {
                **({"Run": runs.evidence_run.get(arm["evidence_id"])} if every else {}),
                "Arm": str(arm.get("arm")),
                "Variant": str(arm.get("variant", "")),
                "k/n": f"{arm.get('failures')}/{arm.get('n')}",
                "Rate": arm.get("rate"),
                "95% low": ci[0] if len(ci) > 0 else None,
                "95% high": ci[1] if len(ci) > 1 else None,
                "p-value": arm.get("p_value"),
                "Decision": str(arm.get("decision", "")),
                "Evidence": arm["evidence_id"],
            }
        )
    table = pd.DataFrame(rows)
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        key="arms_table",
        column_config={
            "Rate": st.column_config.NumberColumn(format="%.3f"),
            "95% low": st.column_config.NumberColumn(format="%.3f"),
            "95% high": st.column_config.NumberColumn(format="%.3f"),
            "p-value": st.column_config.NumberColumn(format="%.3g"),
        },
    )
    if every and runs.latest is not None:
        table = table[table["Run"] == runs.latest]
        st.caption(f"The chart shows one run: {runs.label(runs.latest)}.")
    base = alt.Chart(table).encode(y=alt.Y("Arm:N", title=None, sort=None))
    intervals = base.mark_rule(strokeWidth=2).encode(
        x=alt.X(
            "95% low:Q", title="failure rate with its 95% interval", scale=alt.Scale(domain=[0, 1])
        ),
        x2="95% high:Q",
        color=alt.Color("Decision:N", title="vs baseline"),
    )
    points = base.mark_point(filled=True, size=90).encode(
        x="Rate:Q",
        color=alt.Color("Decision:N"),
        tooltip=["Arm", "Variant", "k/n", "Rate", "95% low", "95% high", "p-value", "Decision"],
    )
    st.altair_chart(intervals + points, width="stretch")


def graph_tab(
    record: JsonObject, runs: IncidentRuns | None = None, run_id: int | None = None
) -> None:
    """The cause graph of one run (the latest when all runs are chosen)."""
    runs = runs or IncidentRuns()
    if run_id == ALL_RUNS:
        run_id = runs.latest
        st.caption(f"The graph shows one run: {runs.label(run_id or 0)}.")
    graph = build_graph(record_for_run(record, runs, run_id))
    counts = summary(graph)
    with_evidence = st.toggle("Show evidence nodes", value=False, key="graph_evidence")
    if not with_evidence:
        # Causes, symptoms, probes and decisions only: the shape an on-call reader needs.
        graph = graph.subgraph(
            [n for n, d in graph.nodes(data=True) if d.get("kind") != "evidence"]
        ).copy()
    dot = to_dot(graph)
    st.caption(
        " · ".join(f"{count} {status}" for status, count in (counts.causes_by_status or {}).items())
        + f" · {counts.nodes} nodes, {counts.edges} edges"
    )
    st.graphviz_chart(dot, width="stretch")
    st.caption("Causes: red confirmed, orange suspected, grey rejected; dashed edges refute.")
    with st.expander("DOT source"):
        st.code(dot, language="dot")
    st.download_button(
        "Download DOT",
        dot,
        file_name=f"{record['slug']}.dot",
        mime="text/vnd.graphviz",
        key="download_dot",
    )


def evidence_tab(record: JsonObject) -> None:
    items = record.get("evidence") or []
    if not items:
        st.info("No evidence recorded.")
        return
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "Id": e.get("id"),
                    "Kind": e.get("kind"),
                    "Summary": e.get("summary", ""),
                    "Source": e.get("source", ""),
                    "Recorded": e.get("recorded_at", ""),
                }
                for e in items
            ]
        ),
        hide_index=True,
        width="stretch",
        key="evidence_table",
    )
    ids = [str(e.get("id")) for e in items]
    wanted = st.query_params.get("evidence")
    chosen = st.selectbox(
        "Show evidence",
        ids,
        index=ids.index(wanted) if wanted in ids else 0,
        key="evidence_pick",
    )
    show_evidence(evidence_index(record)[chosen])


class HistoryRow(TypedDict):
    """One line of the history table (its column names as shown)."""

    At: str
    What: str
    Change: str
    By: str
    Why: str
    Evidence: str


def history_rows(record: JsonObject) -> list[HistoryRow]:
    """Every cause status change and decision of the incident, oldest first."""
    rows: list[HistoryRow] = []
    for cause in record.get("causes") or []:
        for change in cause.get("history") or []:
            rows.append(
                HistoryRow(
                    At=str(change.get("at", "")),
                    What=f"cause {cause.get('id')}",
                    Change=f"{change.get('from') or '(new)'} -> {change.get('to')}",
                    By=change.get("actor", ""),
                    Why=change.get("rationale", ""),
                    Evidence=", ".join(change.get("evidence") or []),
                )
            )
    for decision in record.get("decisions") or []:
        detail = decision.get("kind", "")
        if decision.get("revisit_on"):
            detail += f" (revisit {decision['revisit_on']})"
        if decision.get("kind") == "FIXED":
            detail += " (verified)" if decision.get("verified") else " (unverified)"
        rows.append(
            HistoryRow(
                At=str(decision.get("at", "")),
                What="decision",
                Change=detail,
                By=decision.get("by", ""),
                Why=decision.get("rationale", ""),
                Evidence=", ".join(decision.get("evidence") or []),
            )
        )
    return sorted(rows, key=lambda row: row["At"])


def history_tab(record: JsonObject) -> None:
    rows = history_rows(record)
    if not rows:
        st.info("No history yet.")
        return
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch", key="history_table")
    for decision in record.get("decisions") or []:
        if decision.get("tradeoff") or decision.get("fix"):
            text = f"**{decision.get('kind')}** {md_escape(str(decision.get('at', ''))[:10])}"
            if decision.get("fix"):
                text += f"  \nFix: {md_escape(decision['fix'])}"
            if decision.get("tradeoff"):
                text += f"  \nTradeoff: {md_escape(decision['tradeoff'])}"
            st.markdown(text)


def references_tab(record: JsonObject) -> None:
    references = record.get("references") or []
    if references:
        st.subheader("References")
        for reference in references:
            line = "- " + md_link(
                reference.get("title") or reference.get("url"), reference.get("url")
            )
            if reference.get("note"):
                line += f" -- {md_escape(reference['note'])}"
            st.markdown(line)
    family = record.get("family") or []
    if family:
        st.subheader("Same failure family")
        for link in family:
            note = f" -- {link['note']}" if link.get("note") else ""
            st.markdown(
                md_escape(
                    f"{link.get('cause')} here ~ {link.get('other_cause')} in "
                    f"{link.get('incident')}{note}"
                )
            )
            st.page_link(
                nav.INCIDENT,
                label=md_escape(f"Open {link.get('incident')}"),
                query_params={"slug": str(link.get("incident"))},
                icon=":material/link:",
            )
    atlas = _atlas_section(record, {str(r.get("url")) for r in references})
    if not references and not family and not atlas:
        st.info("No references or family links recorded.")


def _atlas_section(record: JsonObject, shown: set[str]) -> bool:
    """Known public incidents the failure matches (not already a reference): pointers."""
    matches = [m for m in record_matches(record) if m.entry.source not in shown]
    if matches:
        st.subheader("Known public incidents (atlas)")
        st.caption("A pointer to a public report with the facts that matched -- not a verdict.")
    for match in matches:
        why = "; ".join(fact.detail for fact in match.facts)
        advice = [a for a in match.advice if not a.startswith("read: ")]
        line = "- " + md_link(f"{match.entry.id}: {match.entry.title}", match.entry.source)
        line += md_escape(f" -- score {match.score:.1f}: {why}")
        st.markdown(line + "".join(f"  \n  {md_escape(a)}" for a in advice))
    return bool(matches)


def narrative_tab(record: JsonObject) -> None:
    body = str(record.get("body") or "").strip()
    if not body:
        st.info("No narrative recorded.")
        return
    st.html(markdown_to_html(body))


slug = pick_incident()
if slug:
    record = data.load_incident(store, slug)
    if record is None:
        st.title("Incident")
        st.error(md_escape(f"No incident {slug!r} in the knowledge base."))
        st.page_link(nav.INCIDENTS, label="All incidents", icon=":material/list:")
    else:
        notice = st.session_state.pop("incident_notice", None)
        if notice:
            st.success(md_escape(notice))
        header(record)
        st.page_link(
            nav.RETROSPECTIVE,
            label="Retrospective",
            icon=":material/history_edu:",
            query_params={"slug": slug},
        )
        runs = load_runs(store, slug)
        run_id = pick_run(runs)
        unexplained = unexplained_parts(runs, run_id if run_id != ALL_RUNS else None)
        if unexplained:
            headline, ruled_out, probes = unexplained
            st.warning(
                f"**{md_escape(headline)}**  \n{md_escape(ruled_out)}  \nNext probes to try:  \n"
                + "  \n".join(f"• {md_escape(probe)}" for probe in probes)
            )
        tabs = st.tabs(
            [
                "Diagnosis",
                "Probe arms",
                "Cause graph",
                "Evidence",
                "History",
                "References",
                "Narrative",
                "Decide / override",
            ]
        )
        with tabs[0]:
            shown = run_id if run_id != ALL_RUNS else None
            diagnosis_tab(record_for_run(record, runs, shown), run_verdicts(runs, shown))
        with tabs[1]:
            arms_tab(record, runs, run_id)
        with tabs[2]:
            graph_tab(record, runs, run_id)
        with tabs[3]:
            evidence_tab(record)
        with tabs[4]:
            history_tab(record)
        with tabs[5]:
            references_tab(record)
        with tabs[6]:
            narrative_tab(record)
        with tabs[7]:
            decision_form(store, record)
            override_form(store, record)
