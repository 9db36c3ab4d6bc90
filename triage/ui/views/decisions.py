"""Decision log: every PARKED / FIXED / REOPENED decision; overdue parked incidents first."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from triage.ui import data, nav
from triage.ui.text import md_escape

ROWS_PER_PAGE = 200
OVERDUE_CARDS = 20

st.title("Decision log")
store = data.get_store()
on = data.today()
entries = data.decision_log(store, on=on)
overdue = [entry for entry in entries if entry.overdue]

st.caption(f"{len(entries)} decision(s) · today is {on.isoformat()}")
if overdue:
    st.subheader(f"Overdue ({len(overdue)})")
    for entry in overdue[:OVERDUE_CARDS]:
        with st.container(border=True):
            st.error(
                f"**OVERDUE** ({entry.state}) · {md_escape(entry.row.slug)} -- "
                + md_escape("; ".join(entry.reasons)),
                icon=":material/alarm:",
            )
            st.markdown(
                f"**{md_escape(entry.row.title)}**  \n"
                f"PARKED {md_escape(entry.row.at.date().isoformat())}"
                + (f" by {md_escape(entry.row.by)}" if entry.row.by else "")
                + f": {md_escape(entry.row.rationale)}"
            )
            if entry.row.tradeoff:
                st.markdown(f"Tradeoff: {md_escape(entry.row.tradeoff)}")
            st.page_link(
                nav.INCIDENT,
                label="Open the incident",
                icon=":material/open_in_new:",
                query_params={"slug": entry.row.slug},
            )
    if len(overdue) > OVERDUE_CARDS:
        st.caption(
            f"...and {len(overdue) - OVERDUE_CARDS} more, marked OVERDUE at the top "
            "of the table below."
        )
else:
    st.success("No parked incident is past its revisit date or trigger.")

st.subheader("All decisions")
if not entries:
    st.info("No decisions recorded yet.")
else:
    newest_first = st.toggle("Newest first", value=False, key="decisions_newest_first")
    rest = [entry for entry in entries if not entry.overdue]
    ordered = overdue + (list(reversed(rest)) if newest_first else rest)
    pages = max(1, -(-len(ordered) // ROWS_PER_PAGE))
    if st.session_state.get("decisions_page", 1) > pages:
        del st.session_state["decisions_page"]
    page = st.session_state.get("decisions_page", 1)
    ordered = ordered[(page - 1) * ROWS_PER_PAGE : page * ROWS_PER_PAGE]
    table = pd.DataFrame(
        [
            {
                "Overdue": "OVERDUE" if entry.overdue else "",
                "Revisit state": entry.state,
                "At": entry.row.at,
                "Decision": entry.row.kind
                + ("" if entry.row.kind != "FIXED" or entry.row.verified else " (unverified)"),
                "Incident": entry.row.slug,
                "Title": entry.row.title,
                "By": entry.row.by,
                "Rationale": entry.row.rationale,
                "Tradeoff": entry.row.tradeoff,
                "Fix": entry.row.fix,
                "Revisit on": entry.row.revisit_on,
                "Triggers": "; ".join(data.describe_trigger(t) for t in entry.row.triggers),
                "Current": "latest" if entry.latest else "superseded",
            }
            for entry in ordered
        ]
    )
    event = st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        on_select="rerun",
        selection_mode="single-row",
        key="decisions_table",
        column_config={
            "At": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm"),
            "Revisit on": st.column_config.DateColumn(format="YYYY-MM-DD"),
        },
    )
    if pages > 1:
        st.pagination(pages, key="decisions_page")
    st.caption("Select a row to open its incident.")
    if event is not None and event.selection.rows:
        st.switch_page(
            nav.INCIDENT, query_params={"slug": ordered[event.selection.rows[0]].row.slug}
        )
