"""The built-in causes: one module each, registered through the `triage.plugins` entry
points exactly like a third-party cause (see `triage.plugin_api.CauseEntry`)."""
