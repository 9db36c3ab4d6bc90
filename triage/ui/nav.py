"""Page files, relative to app.py, for st.switch_page / st.page_link."""

INCIDENTS = "views/incidents.py"
INCIDENT = "views/incident.py"
NEW_TRIAGE = "views/new_triage.py"
DECISIONS = "views/decisions.py"
RETROSPECTIVE = "views/retrospective.py"
LIVE = "views/live.py"
