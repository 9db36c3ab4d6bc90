"""The incident page's forms: record a decision, override a cause's status."""

from __future__ import annotations

import streamlit as st

from kb.domain.errors import StoreError
from kb.jsontypes import JsonObject
from kb.repo import decisions as kb_decisions
from kb.service import KnowledgeBase
from triage.ui import actions, data
from triage.ui.text import md_escape

STATUS_ORDER = ("confirmed", "suspected", "rejected")


def decision_form(store: KnowledgeBase, record: JsonObject) -> None:
    """Record a PARKED / FIXED / REOPENED decision on the incident."""
    evidence_ids = [str(e.get("id")) for e in record.get("evidence") or []]
    with st.form("decision_form"):
        st.subheader("Record a decision")
        kind = st.radio(
            "Decision", ["PARKED", "FIXED", "REOPENED"], horizontal=True, key="decision_kind"
        )
        by = st.text_input("Who decides", key="decision_by")
        rationale = st.text_area("Why", key="decision_rationale")
        tradeoff = st.text_area("Tradeoff (what it costs)", key="decision_tradeoff")
        st.markdown("**PARKED** -- when to look again (a date and/or triggers)")
        revisit_on = st.date_input("Revisit on", value=None, key="decision_revisit")
        triggers = st.text_area(
            "Revisit when (one trigger per line)",
            placeholder="new-build\nnew-weights\nfailure-rate>20%,min=5\ndate=2026-12-01",
            help="Syntax: " + kb_decisions.TRIGGER_SYNTAX,
            key="decision_triggers",
        )
        st.markdown("**FIXED** -- what fixed it, and the probe run that shows it")
        fix = st.text_area("Fix", key="decision_fix")
        evidence_keys = st.multiselect("Evidence", evidence_ids, key="decision_evidence")
        force = st.checkbox(
            "Record the fix even if the evidence does not verify it (labelled unverified)",
            key="decision_force",
        )
        submitted = st.form_submit_button("Record decision")
    if not submitted:
        return
    decision = actions.DecisionInput(
        kind=kind,
        by=by,
        rationale=rationale,
        tradeoff=tradeoff,
        fix=fix,
        revisit_on=revisit_on,
        triggers=triggers.splitlines(),
        evidence_keys=list(evidence_keys),
        force=force,
    )
    try:
        actions.record_decision(store, record["slug"], decision)
    except (actions.ActionError, StoreError) as exc:
        st.error(md_escape(f"Not recorded: {exc}"))
        return
    data.parked_changed()
    st.session_state["incident_notice"] = f"Recorded {kind}."
    st.rerun()


def override_form(store: KnowledgeBase, record: JsonObject) -> None:
    """Override one cause's status, with who, why and the evidence."""
    causes = record.get("causes") or []
    if not causes:
        return
    titles = {str(c.get("id")): f"{c.get('id')} ({c.get('status')})" for c in causes}
    evidence_ids = [str(e.get("id")) for e in record.get("evidence") or []]
    with st.form("override_form"):
        st.subheader("Override a cause status")
        cause_key = st.selectbox(
            "Cause", list(titles.keys()), format_func=lambda key: titles[key], key="override_cause"
        )
        to_status = st.radio(
            "New status", list(STATUS_ORDER), horizontal=True, key="override_status"
        )
        actor = st.text_input("Who", key="override_actor")
        rationale = st.text_area("Why", key="override_rationale")
        evidence_keys = st.multiselect("Evidence", evidence_ids, key="override_evidence")
        submitted = st.form_submit_button("Change status")
    if not submitted or cause_key is None or to_status is None:
        return
    try:
        actions.override_cause_status(
            store,
            record["slug"],
            cause_key,
            to_status,
            actor=actor,
            rationale=rationale,
            evidence_keys=list(evidence_keys),
        )
    except (actions.ActionError, StoreError) as exc:
        st.error(md_escape(f"Not changed: {exc}"))
        return
    data.parked_changed()
    st.session_state["incident_notice"] = f"{cause_key} is now {to_status}."
    st.rerun()
