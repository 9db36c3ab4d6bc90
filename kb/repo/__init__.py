"""Knowledge-base storage: sessions, queries, rows, migrations glue, incident files."""
