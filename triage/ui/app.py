"""Streamlit entry point (`triage ui`): the pages of the knowledge base and the engine."""

from __future__ import annotations

import streamlit as st

from triage.ui import gate

# An emoji favicon is drawn in the browser (an inline SVG); a ":material/..." page icon is
# fetched from fonts.gstatic.com on every page, which fails offline.
st.set_page_config(page_title="triage", page_icon="🔎", layout="wide")

# Authentication first: nothing below runs for a request that is not signed in (triage ui
# refuses a non-loopback address without it; see triage/ui/auth.py).
gate.require_user(gate.settings())

# The page scripts live in views/, not pages/: a pages/ folder next to the entry script
# switches Streamlit's server into the legacy multipage mode until st.navigation runs.
PAGES = [
    st.Page("views/incidents.py", title="Incidents", icon=":material/list:", default=True),
    st.Page(
        "views/incident.py", title="Incident", icon=":material/troubleshoot:", url_path="incident"
    ),
    st.Page(
        "views/new_triage.py",
        title="New triage",
        icon=":material/add_circle:",
        url_path="new-triage",
    ),
    st.Page(
        "views/decisions.py", title="Decision log", icon=":material/gavel:", url_path="decisions"
    ),
    st.Page(
        "views/retrospective.py",
        title="Retrospective",
        icon=":material/history_edu:",
        url_path="retrospective",
    ),
    st.Page("views/live.py", title="Live", icon=":material/monitoring:", url_path="live"),
]

st.navigation(PAGES).run()
