"""The built-in probe arms, registered through the `triage.plugins` entry points exactly
like a third-party arm (see `triage.probes.ProbeArm`)."""
