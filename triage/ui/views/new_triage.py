"""New triage: paste or upload a failing exchange, pick a configured stack, run the engine."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from triage.capture import format_ids
from triage.ui import actions, data, gate, nav
from triage.ui.auth import UiConfigError, stack_choices
from triage.ui.text import md_escape

# "auto" sniffs; then every registered capture format (plugins included), in sniff order.
FORMATS = ["auto", *(f for f in format_ids() if f != "auto")]

st.title("New triage")
st.caption(
    "The exchange is redacted (keys, tokens, cookies) before it is stored. Probes start "
    "llama-server variants from the stack file on this machine, on loopback."
)
store = data.get_store()

# Only stack files an administrator configured (`triage ui --stack FILE`, `[ui] stacks`):
# a stack names the binary and the arguments this machine runs, so nobody types one here.
try:
    stacks = {choice.label: choice for choice in stack_choices(gate.settings())}
except UiConfigError as exc:
    st.error(md_escape(str(exc)))
    stacks = {}
if not stacks:
    st.warning(
        "No stack is configured, so no triage can run from this page. An administrator "
        "lists the stack files it may use with `triage ui --stack FILE` or `stacks = [...]` "
        "under `[ui]` in ui.toml."
    )
stack_label = st.selectbox("Stack", list(stacks), key="triage_stack")
if stack_label is not None:
    with st.expander("What this stack runs"):
        st.code(stacks[stack_label].text, language="toml")

with st.form("new_triage"):
    st.subheader("Failing exchange")
    exchange_text = st.text_area(
        'Paste it: a {"request", "response"} JSON pair, a curl command, an SSE transcript, '
        "HAR or JSONL",
        height=200,
        key="triage_exchange_text",
    )
    exchange_file = st.file_uploader("...or upload it", key="triage_exchange_file")
    format_col, index_col = st.columns(2)
    exchange_format = format_col.selectbox("Format", FORMATS, key="triage_format")
    exchange_number = index_col.number_input(
        "Exchange number (HAR / JSONL hold several)",
        min_value=1,
        value=1,
        step=1,
        key="triage_index",
    )
    response_text = st.text_area(
        "Response body, when the exchange above is only the request (optional)",
        height=100,
        key="triage_response_text",
    )
    st.subheader("Run")
    cap_col, incident_col = st.columns(2)
    max_requests = cap_col.number_input(
        "Most requests per probe arm",
        min_value=4,
        max_value=10_000,
        value=32,
        step=4,
        key="triage_max_requests",
    )
    incident_slug = incident_col.text_input(
        "Add to incident (slug; empty: a new incident)", key="triage_incident"
    )
    submitted = st.form_submit_button("Run triage", type="primary", disabled=not stacks)

if submitted:
    exchange_bytes = exchange_file.getvalue() if exchange_file else exchange_text.encode()
    exchange_name = exchange_file.name if exchange_file else "pasted exchange"
    chosen = stacks[stack_label] if stack_label in stacks else None
    request = actions.TriageInput(
        exchange=exchange_bytes,
        exchange_name=exchange_name,
        exchange_format=exchange_format,
        exchange_index=int(exchange_number) - 1,
        response=response_text.encode() if response_text.strip() else None,
        stack_text=chosen.text if chosen else "",
        stack_base=chosen.base if chosen else Path("."),
    )
    diagnosis = None
    try:
        exchange, stack = actions.prepare(request)
        bar = st.progress(0.0, text="Starting the engine...")

        def report(fraction: float, message: str) -> None:
            bar.progress(fraction, text=md_escape(message) if message else None)

        diagnosis = actions.run_triage(
            store,
            exchange,
            stack,
            report,
            max_requests=int(max_requests),
            incident=incident_slug.strip() or None,
        )
    except ValueError as exc:
        st.error(md_escape(str(exc)))
    except Exception as exc:  # the engine's own failures: show them, keep the form
        st.exception(exc)
    if diagnosis is not None:
        data.parked_changed()
        state = diagnosis.state
        slug = diagnosis.incident
        if state == "not-reproduced":
            reproduction = diagnosis.reproduction
            st.warning(
                "Not reproduced: "
                + md_escape(
                    (reproduction.message if reproduction else "")
                    or "the replays did not show the captured failure"
                )
                + " No cause was moved."
            )
        elif state == "partial":
            errors = [e for e in diagnosis.undecided if e.startswith("arm ")]  # errored arms
            st.warning(
                "The run ended partial (some probes failed); its verdicts rest on "
                "fewer arms." + (" " + md_escape("; ".join(errors[:3])) if errors else "")
            )
        if slug and state in ("not-reproduced", "partial"):
            st.page_link(
                nav.INCIDENT,
                label="Open the incident",
                icon=":material/open_in_new:",
                query_params={"slug": slug},
            )
        elif slug:
            st.switch_page(nav.INCIDENT, query_params={"slug": slug})
        else:
            st.error("The engine finished without naming an incident.")
            st.json(diagnosis.to_json())
