"""The model-file lint kinds (issue 23) in the check catalogue: `chat-template-missing`,
`base-model-for-chat`, `end-of-turn-mismatch`.

They are findings about the model FILE and the server serving it, not about one exchange:
triage.llama.model_lint decides them from the GGUF's metadata and the server's own log, and
`triage diagnose` adds them to the diagnosis before any replay. They are registered here so
that their kinds and numbers are catalogue entries like every finding kind (numbering,
family bits, plugins' view of the vocabulary). On an exchange alone they cannot be decided:
`classify` says so in a passed finding, as every check does where it cannot apply; the reply
side of the same mechanism is `template-markup-in-content`'s.
"""

from __future__ import annotations

from triage.catalogue import Catalogue
from triage.checks.base import Finding, FunctionCheck, View, _pass, check
from triage.llama.model_lint import BASE_KIND, EOT_KIND, TEMPLATE_KIND

NOT_FROM_AN_EXCHANGE = (
    "a model-file lint: decided from the GGUF metadata and the server's log when a "
    "diagnosis starts the server, not from an exchange"
)


def _lint_kind(kind: str, number: int) -> FunctionCheck:
    def run(view: View) -> list[Finding]:
        return _pass(kind, NOT_FROM_AN_EXCHANGE)

    run.__doc__ = f"{kind}: {NOT_FROM_AN_EXCHANGE}."
    return check(kind, number=number, user_facing=False)(run)


# Each kind with its stable number (triage/plugin_api.py).
CHECKS = tuple(
    _lint_kind(kind, number)
    for kind, number in ((TEMPLATE_KIND, 19), (BASE_KIND, 20), (EOT_KIND, 21))
)


def register(catalogue: Catalogue) -> None:
    """Entry point: add the lint kinds to the catalogue."""
    for item in CHECKS:
        catalogue.checks.add(item)
