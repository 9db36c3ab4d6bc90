"""Fire drills: tiny crafted GGUF models with known ground truth, run on a real llama-server."""

from triage.drills.compiler import WEIGHT_FORMATS, WeightFormat, compile_design
from triage.drills.language import Design, DesignError, TokenKind, Vocabulary
from triage.drills.registry import Drill, build_drill, list_drills, write_stack
from triage.drills.template import TemplateNotFound, gemma4_template, gemma4_template_path

__all__ = [
    "WEIGHT_FORMATS",
    "Design",
    "DesignError",
    "Drill",
    "TemplateNotFound",
    "TokenKind",
    "Vocabulary",
    "WeightFormat",
    "build_drill",
    "compile_design",
    "gemma4_template",
    "gemma4_template_path",
    "list_drills",
    "write_stack",
]
