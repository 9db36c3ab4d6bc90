"""Built-in check `template-markup-in-content` (issue 23): the chat template's own turn
markup appears in the reply's content -- ChatML's `<|im_start|>` / `<|im_end|>`, Gemma's
`<start_of_turn>` / `<end_of_turn>`, Llama 3's header and `<|eot_id|>` tokens, Mistral's
`[INST]`, Phi's `<|user|>` / `<|assistant|>` / `<|end|>`, DeepSeek's full-width role
tokens, Command-R's turn tokens.

A model that writes the markup of a turn as text did not end its turn the way its format
expects: a base model continuing a transcript, a template the model was not trained on (a
GGUF without one: the server falls back to ChatML), an end-of-turn token that is not an
end-of-generation token (`end-of-turn-mismatch`). Measured: Gemma 3 270M base served for
chat on b11434 writes "Paris<|im_end|>\\n<|im_start|>admin\\n..." until max_tokens.

Markup the request itself carries (a user asking about ChatML) is not counted. Thought
markup is `reasoning-markup-in-content`'s, tool-call markup `tool-markup-leaked`'s.
"""

from __future__ import annotations

import json
import re

from triage.catalogue import Catalogue
from triage.checks.base import MAX_SCAN_CHARS, Finding, View, _no_completion_reason, _pass, check

KIND = "template-markup-in-content"
_TURN_MARKUP = re.compile(
    r"<\|im_start\|>|<\|im_end\|>|<\|im_sep\|>"  # ChatML (Qwen, SmolLM, Hermes, phi-4)
    r"|<start_of_turn>|<end_of_turn>"  # Gemma 2/3
    r"|<\|start_header_id\|>|<\|end_header_id\|>|<\|eot_id\|>|<\|begin_of_text\|>"  # Llama 3
    r"|\[/?INST\]|\[/?SYSTEM_PROMPT\]"  # Mistral
    r"|<\|(?:user|assistant|system)\|>|<\|end\|>"  # Phi-3, Zephyr-style
    r"|<｜(?:User|Assistant)｜>|<｜end▁of▁sentence｜>"  # DeepSeek
    r"|<\|(?:START|END)_OF_TURN_TOKEN\|>|<\|(?:USER|CHATBOT|SYSTEM)_TOKEN\|>"  # Command-R
    r"|<\|endoftext\|>"
)


def _request_markup(view: View) -> set[str]:
    """Markup the request's own text carries (then its echo is no leak)."""
    try:
        text = json.dumps(view.request.get("messages"), ensure_ascii=False)[:MAX_SCAN_CHARS]
    except (TypeError, ValueError):
        return set()
    return set(_TURN_MARKUP.findall(text))


@check(KIND, number=28)
def check_template_markup(view: View) -> list[Finding]:
    """The chat template's turn markup is written as text into the reply's content."""
    if not view.choices:
        return _pass(KIND, _no_completion_reason(view))
    asked = _request_markup(view)
    findings = []
    for choice in view.choices:
        text = choice.content[:MAX_SCAN_CHARS]
        hits = [m for m in _TURN_MARKUP.finditer(text) if m.group(0) not in asked]
        if not hits:
            continue
        names = sorted({m.group(0) for m in hits}, key=lambda s: text.index(s))
        first = hits[0]
        findings.append(
            Finding(
                KIND,
                False,
                1.0,
                f"the chat format's turn markup is written into content: {', '.join(names[:4])} "
                f"({len(hits)} times, first at char {first.start()}): the model did not end "
                "its turn the way its format expects",
                choice.content_path,
                first.start(),
            )
        )
    return findings or _pass(KIND, "no chat-template markup in content")


def register(catalogue: Catalogue) -> None:
    """Entry point: add this module's check to the catalogue."""
    catalogue.checks.add(check_template_markup)
