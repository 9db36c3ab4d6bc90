"""Issue 18 items 4 and 5 without a llama-server: secret server flags are masked in what the
engine records but kept (in memory) for the replays; incident slugs are ASCII whatever the
model file is called, so export works."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb.domain.slugs import SLUG_RE
from kb.repo import runs
from kb.repo.files import export_incident
from kb.repo.store import Store
from triage.engine.servers import (
    EngineError,
    api_key_from_args,
    safe_args,
    safe_describe,
    safe_stack_raw,
    scrub_secrets,
    secret_values,
)
from triage.stackfile import ServerConfig

KEY = "wiring-secret-7c1f9a2e"


@pytest.mark.parametrize(
    "args",
    [
        ["--api-key", KEY],
        [f"--api-key={KEY}"],
        ["-c", "512", "--api-key", f"{KEY},second-key"],
    ],
)
def test_the_replay_key_comes_from_the_server_flags(args: list[str]) -> None:
    assert api_key_from_args(args) == KEY


def test_the_replay_key_is_read_from_an_api_key_file(tmp_path: Path) -> None:
    (tmp_path / "keys").write_text(f"\n{KEY}\nother\n")
    assert api_key_from_args(["--api-key-file", str(tmp_path / "keys")]) == KEY
    assert api_key_from_args([f"--api-key-file={tmp_path / 'keys'}"]) == KEY
    with pytest.raises(EngineError, match="--api-key-file: cannot read it"):
        api_key_from_args(["--api-key-file", str(tmp_path / "missing")])
    assert api_key_from_args(["-c", "512"]) is None


@pytest.mark.parametrize(
    "args",
    [
        ["--api-key", KEY, "-c", "512"],
        [f"--api-key={KEY}", "-c", "512"],
        ["--ssl-key-file", f"/etc/{KEY}.pem", "-c", "512"],
        [f"--api-key-file=/run/{KEY}", "-c", "512"],
    ],
)
def test_recorded_server_args_never_carry_the_secret(args: list[str]) -> None:
    config = ServerConfig(Path("llama-server"), Path("m.gguf"), args)
    described = safe_describe(config)
    raw = safe_stack_raw(
        {"server": {"model": "m.gguf", "args": args}, "known_good": {"args": args}}
    )
    for recorded in (safe_args(args), described, raw):
        assert KEY not in repr(recorded)
    assert "-c" in described["args"] and "512" in described["args"]
    assert config.args == args  # the real values stay with the launch


def test_a_non_ascii_model_name_gives_an_ascii_slug_that_exports(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'kb.db'}")
    try:
        with store.session() as session:
            first = runs.new_incident(
                session, runs.NewIncident(model="Modèle-ÜBER²-qat", kinds=["length-stop"])
            )
            second = runs.new_incident(
                session, runs.NewIncident(model="Modèle-ÜBER²-qat", kinds=["length-stop"])
            )
            slugs = [first.slug, second.slug]
        assert all(SLUG_RE.match(slug) for slug in slugs), slugs
        assert slugs[0].endswith("-modele-uber2-qat-length-stop")
        assert slugs[1] == slugs[0] + "-2"
        for slug in slugs:
            assert export_incident(store, slug, tmp_path / "out").is_file()
    finally:
        store.close()


def test_a_launch_error_quoting_the_argv_is_scrubbed(tmp_path: Path) -> None:
    (tmp_path / "keys").write_text(f"{KEY}-from-file\n")
    args = ["--api-key", KEY, "--api-key-file", str(tmp_path / "keys"), "-c", "512"]
    secrets = secret_values(args)
    message = (
        f"llama-server exited with code 1 during startup\nargv ['llama-server', "
        f"'--api-key', '{KEY}', '-c', '512']; log: key {KEY}-from-file rejected"
    )
    facts = {"startup-crash": {"summary": message, "lines": [message]}}
    for scrubbed in (scrub_secrets(message, secrets), scrub_secrets(facts, secrets)):
        assert KEY not in repr(scrubbed)
        assert "-c', '512'" in repr(scrubbed) and "[REDACTED:" in repr(scrubbed)
    assert scrub_secrets(message, secret_values(["-c", "512"])) == message
