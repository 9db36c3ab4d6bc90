"""Symptom checks: the shared base (Finding, View, the Check protocol) and the built-in
checks, one module per area, each registered through a `triage.plugins` entry point."""
