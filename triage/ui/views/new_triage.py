"""New triage: paste or upload a failing exchange and a stack file, run the engine."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from triage.ui import actions, data, nav
from triage.ui.text import md_escape

FORMATS = ["auto", "pair", "curl", "sse", "har", "jsonl"]

st.title("New triage")
st.caption(
    "The exchange is redacted (keys, tokens, cookies) before it is stored. Probes start "
    "llama-server variants from the stack file on this machine, on loopback."
)
store = data.get_store()

with st.form("new_triage"):
    st.subheader("Failing exchange")
    exchange_text = st.text_area(
        "Paste it: a {\"request\", \"response\"} JSON pair, a curl command, an SSE transcript, "
        "HAR or JSONL",
        height=200,
        key="triage_exchange_text",
    )
    exchange_file = st.file_uploader("...or upload it", key="triage_exchange_file")
    format_col, index_col = st.columns(2)
    exchange_format = format_col.selectbox("Format", FORMATS, key="triage_format")
    exchange_number = index_col.number_input(
        "Exchange number (HAR / JSONL hold several)", min_value=1, value=1, step=1,
        key="triage_index",
    )
    response_text = st.text_area(
        "Response body, when the exchange above is only the request (optional)",
        height=100,
        key="triage_response_text",
    )
    st.subheader("Stack")
    stack_text = st.text_area(
        "stack.toml", height=200, key="triage_stack_text",
        placeholder='[server]\nmodel = "gemma-4-qat.gguf"\nargs = ["-c", "8192"]',
    )
    stack_file = st.file_uploader("...or upload it", type=["toml"], key="triage_stack_file")
    stack_base = st.text_input(
        "Folder that relative paths in the stack file resolve against",
        value=str(Path.cwd()),
        key="triage_stack_base",
    )
    st.subheader("Run")
    cap_col, incident_col = st.columns(2)
    max_requests = cap_col.number_input(
        "Most requests per probe arm", min_value=4, max_value=10_000, value=32, step=4,
        key="triage_max_requests",
    )
    incident_slug = incident_col.text_input(
        "Add to incident (slug; empty: a new incident)", key="triage_incident"
    )
    submitted = st.form_submit_button("Run triage", type="primary")

if submitted:
    exchange_bytes = exchange_file.getvalue() if exchange_file else exchange_text.encode()
    exchange_name = exchange_file.name if exchange_file else "pasted exchange"
    stack_source = stack_file.getvalue().decode("utf-8", "replace") if stack_file else stack_text
    request = actions.TriageInput(
        exchange=exchange_bytes,
        exchange_name=exchange_name,
        exchange_format=exchange_format,
        exchange_index=int(exchange_number) - 1,
        response=response_text.encode() if response_text.strip() else None,
        stack_text=stack_source,
        stack_base=Path(stack_base or ".").expanduser(),
    )
    diagnosis = None
    try:
        exchange, stack = actions.prepare(request)
        bar = st.progress(0.0, text="Starting the engine...")

        def report(fraction: float, message: str) -> None:
            bar.progress(fraction, text=md_escape(message) if message else None)

        diagnosis = actions.run_triage(
            store, exchange, stack, report,
            max_requests=int(max_requests), incident=incident_slug.strip() or None,
        )
    except ValueError as exc:
        st.error(md_escape(str(exc)))
    except Exception as exc:  # the engine's own failures: show them, keep the form
        st.exception(exc)
    if diagnosis is not None:
        data.parked_changed()
        if diagnosis.get("incident"):
            st.switch_page(nav.INCIDENT, query_params={"slug": str(diagnosis["incident"])})
        st.error("The engine finished without naming an incident.")
        st.json(diagnosis)
