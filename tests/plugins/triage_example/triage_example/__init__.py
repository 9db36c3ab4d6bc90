"""An example third-party triage plugin (distribution `triage-example-plugin`).

Everything arrives through one `triage.plugins` entry point (`example = "triage_example"`);
no file of triage/ or kb/ knows about it:

- capture format `vgw`: a vendor gateway's line log (`triage_example.vgw`);
- symptom check `all-thought-reply` (number 32): a reply that is a long thought and no
  answer (`triage_example.thought`);
- cause `unbounded-reasoning-budget` (number 32), decided by the server-level arm
  `server-reasoning-budget`, which restarts the server with a `--reasoning-budget` below
  the request's max_tokens (`triage_example.budget`). The arm only applies to stacks that
  set `--reasoning-budget` themselves: an operator who manages the thinking budget on the
  server opts in, and every other diagnosis is left exactly as it was.
"""

from __future__ import annotations

from typing import Any

from triage_example import budget, thought, vgw

__all__ = ["register"]


def register(catalogue: Any) -> None:
    """The entry point: add the plugin's four entries to triage's catalogue."""
    catalogue.formats.add(vgw.FORMAT)
    catalogue.checks.add(thought.ALL_THOUGHT)
    catalogue.causes.add(budget.CAUSE)
    catalogue.arms.add(budget.ServerReasoningBudget())
