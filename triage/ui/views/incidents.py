"""Incidents: every incident with its status, findings, confirmed causes and decision."""

from __future__ import annotations

import hashlib

import pandas as pd
import streamlit as st

from triage.catalogue import catalogue as process_catalogue
from triage.ui import data, nav

# The shareable deep link: /?incident=SLUG opens that incident. Loaded at the root, the
# Streamlit client finds its server at once; a page path (/incident?slug=...) opened
# directly makes it probe /incident/_stcore/* first (two same-origin 404s, see README).
if shared := st.query_params.get("incident"):
    st.switch_page(nav.INCIDENT, query_params={"slug": str(shared)})

st.title("Incidents")
store = data.get_store()
choices = data.filter_choices(process_catalogue().causes.ids())
families = data.families(store)
family_labels = {family.key: family.label for family in families}

query = st.text_input(
    "Search", key="incidents_query", placeholder="e.g. empty content finish length thinking"
)
status_col, cause_col, cause_status_col, decision_col, family_col = st.columns(5)
statuses = status_col.multiselect("Status", choices.statuses, key="incidents_status")
cause = cause_col.selectbox(
    "Cause",
    ["", *choices.causes],
    key="incidents_cause",
    format_func=lambda value: value or "any cause",
)
cause_status = cause_status_col.selectbox(
    "Cause status",
    ["", *choices.cause_statuses],
    key="incidents_cause_status",
    format_func=lambda value: value or "any status",
)
decision = decision_col.selectbox(
    "Decision",
    ["", *choices.decisions, "none"],
    key="incidents_decision",
    format_func=lambda value: {"": "any decision", "none": "no decision yet"}.get(value, value),
)
family = family_col.selectbox(
    "Family",
    ["", *family_labels],
    key="incidents_family",
    format_func=lambda value: family_labels.get(value, "any family"),
)
filters = data.IncidentFilters(
    query=query,
    statuses=tuple(statuses),
    cause=cause,
    cause_status=cause_status,
    decision=decision,
    family=family,
)

# One pagination widget per filter combination: a new filter starts again at page 1.
page_key = "incidents_page:" + hashlib.sha1(repr(filters).encode()).hexdigest()[:12]
result = data.list_incidents(
    store, filters, page=st.session_state.get(page_key, 1), page_size=data.PAGE_SIZE
)
if st.session_state.get(page_key, 1) > result.pages:  # fewer incidents than last time
    del st.session_state[page_key]

searched = f" · best {data.SEARCH_LIMIT} matches at most" if result.searched else ""
st.caption(
    f"{result.total} incident(s) · page {result.page} of {result.pages}{searched} · "
    "select a row to open the incident"
)
table = pd.DataFrame(
    [
        {
            "Opened": row.opened,
            "Incident": row.slug,
            "Title": row.title,
            "Status": row.status,
            "Findings": ", ".join(row.findings),
            "Confirmed causes": ", ".join(row.confirmed_causes),
            "Decision": row.decision,
            "Revisit on": row.revisit_on,
            "Match": row.match,
        }
        for row in result.rows
    ],
    columns=[
        "Opened",
        "Incident",
        "Title",
        "Status",
        "Findings",
        "Confirmed causes",
        "Decision",
        "Revisit on",
        "Match",
    ],
)
if not result.searched:
    table = table.drop(columns=["Match"])
event = st.dataframe(
    table,
    hide_index=True,
    width="stretch",
    on_select="rerun",
    selection_mode="single-row",
    key="incidents_table",
    column_config={
        "Opened": st.column_config.DateColumn(format="YYYY-MM-DD"),
        "Revisit on": st.column_config.DateColumn(format="YYYY-MM-DD"),
    },
)
if result.pages > 1:
    st.pagination(result.pages, key=page_key)

selected = event.selection.rows if event is not None else []
if selected:
    slug = result.rows[selected[0]].slug
    st.switch_page(nav.INCIDENT, query_params={"slug": slug})
