"""Page files, relative to app.py, for st.switch_page / st.page_link."""

INCIDENTS = "pages/incidents.py"
INCIDENT = "pages/incident.py"
NEW_TRIAGE = "pages/new_triage.py"
DECISIONS = "pages/decisions.py"
RETROSPECTIVE = "pages/retrospective.py"
