"""Live: what `triage proxy` recorded -- failure rates over time per signature (a chart), the
upstream's identity, the current rates with their intervals, and the incidents it opened."""

from __future__ import annotations

from datetime import timedelta

import pandas as pd
import streamlit as st

from kb.domain.retrotext import failing_text
from kb.models import utcnow
from kb.repo import live
from kb.repo.liveincidents import MATCHED_PREFIX
from triage.stats import wilson
from triage.ui import data, livechart, nav
from triage.ui.text import md_escape

WINDOWS = {
    "last hour": timedelta(hours=1),
    "last 6 hours": timedelta(hours=6),
    "last 24 hours": timedelta(days=1),
    "last 7 days": timedelta(days=7),
}
BUCKETS = 30  # points per series in the chart

st.title("Live")
store = data.get_store()
choice = st.selectbox("Window", list(WINDOWS), index=2, key="live_window")
span = WINDOWS[choice]
until = utcnow() + timedelta(seconds=1)
since = until - span
bucket = span / BUCKETS
overview = store.live_overview(since, until, bucket)
upstream, points, cells, opened = (
    overview.upstream,
    overview.points,
    overview.cells,
    overview.opened,
)

if upstream is None:
    st.info(
        "Nothing recorded yet. Put `triage proxy --upstream URL` in front of a "
        "llama-server and send traffic through it."
    )
else:
    st.subheader("Upstream")
    cols = st.columns(3)
    cols[0].metric("Model", upstream.model or "unknown")
    cols[1].metric("Build", upstream.build or "unknown")
    cols[2].metric("Chat template", (upstream.template_sha256 or "unknown")[:12])
    st.caption(
        f"as of the latest exchange, {upstream.recorded_at:%Y-%m-%d %H:%M:%S} UTC, "
        f"via {md_escape(upstream.replica)}"
    )

st.subheader("Failure rate over time")
if points:
    st.altair_chart(livechart.rate_chart(livechart.rate_frame(points)), width="stretch")
    st.caption(
        f"Share of each model's exchanges failing with the signature, per "
        f"{int(bucket.total_seconds() // 60) or 1}-minute bucket (a point per bucket). "
        f"{live.CONFIGURED_MARK}: failures the client configured (its own max_tokens or "
        "stop list), recorded but opening no incident."
    )
else:
    st.success(f"No failing exchange in the {choice}.")

st.subheader("Rates in the window")
if cells:
    rows = []
    for cell in cells:
        interval = wilson(cell.failures, cell.n)
        rows.append(
            {
                "Model": cell.model,
                "Client": cell.client,
                "Signature": cell.signature,
                "Client-configured": cell.client_limit or "-",
                "k/n": f"{cell.failures}/{cell.n}",
                "Rate": round(cell.failures / cell.n, 4) if cell.n else 0.0,
                "95% interval": f"{interval.low:.1%} - {interval.high:.1%}",
            }
        )
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
else:
    st.caption("No failures recorded in the window.")

st.subheader("Incidents opened or matched by the proxy")
if not opened:
    st.caption("None yet: a signature opens one when the sequential test finds it new or rising.")
for item in opened:
    by = item.opened_by
    if by.startswith(MATCHED_PREFIX):  # an incident opened by other means
        how = f"same failure family: evidence added by {by.removeprefix(MATCHED_PREFIX)}"
    else:
        how = f"opened by {by}"
    variants = item.variants or (item.signature,)
    with st.container(border=True):
        # One number, the problem's latest detection, with the time it holds for; the
        # title carries none (it is written once, when the incident opens).
        st.markdown(
            f"**{md_escape(item.title)}**  \n"
            f"{md_escape(item.slug)} · {md_escape(item.status)} · "
            f"{md_escape(failing_text(item.detection))} · {md_escape(how)}  \n"
            f"signature{'s' if len(variants) > 1 else ''}: "
            + ", ".join(md_escape(v) for v in variants)
        )
        st.page_link(
            nav.INCIDENT,
            label="Open the incident",
            icon=":material/open_in_new:",
            query_params={"slug": item.slug},
        )
