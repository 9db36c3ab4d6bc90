"""llama-server command-line vocabulary shared by kb and triage (kb cannot import triage):
which flags switch speculative decoding on or configure it.

`triage.stackfile` strips these for the `spec-off` arm; `kb.repo.family` reads them to tell
whether a recorded stack ran with speculative decoding. One list, so the two never drift.
"""

from __future__ import annotations

# Flags that load a draft model: speculative decoding is on whenever one is given.
DRAFT_MODEL_FLAGS = frozenset(
    {
        "--spec-draft-model",
        "-md",
        "--model-draft",
        "--draft-model",  # older builds' spelling
        "--spec-draft-hf",
        "-hfd",
        "-hfrd",
        "--hf-repo-draft",
    }
)

# Value-taking flags (flag, value) that switch speculative decoding on or configure it;
# both the long and the short spellings.
SPEC_VALUE_FLAGS = frozenset(
    DRAFT_MODEL_FLAGS
    | {
        "--spec-type",
        "--spec-draft-n-max",
        "--spec-draft-n-min",
        "--draft",
        "--draft-n",
        "--draft-max",
        "--draft-min",
        "--draft-n-min",
        "--spec-draft-p-min",
        "--draft-p-min",
        "--spec-draft-p-split",
        "--draft-p-split",
        "--spec-draft-ngl",
        "-ngld",
        "--gpu-layers-draft",
        "--n-gpu-layers-draft",
        "--spec-draft-device",
        "-devd",
        "--device-draft",
        "--spec-draft-threads",
        "-td",
        "--threads-draft",
        "--spec-draft-threads-batch",
        "-tbd",
        "--threads-batch-draft",
        "--spec-draft-type-k",
        "-ctkd",
        "--cache-type-k-draft",
        "--spec-draft-type-v",
        "-ctvd",
        "--cache-type-v-draft",
        "--spec-draft-sampling",
        "--spec-synth-len",
        "--spec-synth-rates",
    }
)
# Switches (no value).
SPEC_SWITCH_FLAGS = frozenset({"--spec-default", "--spec-draft-backend-sampling"})
# Any other flag with this prefix is a speculative-decoding flag too.
SPEC_PREFIXES = ("--spec-",)
