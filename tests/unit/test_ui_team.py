"""Issue 18 (10): the UI for a team -- authentication off loopback, configured stacks only.

The CLI side runs `triage ui` with `os.execve` replaced (nothing is started); the app side
runs the real pages with Streamlit's AppTest.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from streamlit.testing.v1 import AppTest

from kb.repo.files import import_paths
from kb.repo.store import Store
from triage.cli import cli
from triage.commands import ui
from triage.ui import data, gate
from triage.ui.auth import UiConfigError, UiSettings, stack_choices

REPO = Path(__file__).resolve().parents[2]
APP = str(REPO / "triage" / "ui" / "app.py")
REFERENCE = "2026-06-10-gemma4-empty-response"
OIDC_SECRETS = """
[auth]
redirect_uri = "https://triage.example.org/oauth2callback"
cookie_secret = "a-long-random-string"
client_id = "triage"
client_secret = "not-a-real-secret"
server_metadata_url = "https://login.example.org/.well-known/openid-configuration"
"""


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[list[str], dict]]:
    calls: list[tuple[list[str], dict[str, Any]]] = []
    monkeypatch.setattr(ui.os, "execve", lambda path, argv, env: calls.append((argv, env)))
    monkeypatch.chdir(tmp_path)  # no ./.streamlit/secrets.toml unless a test writes one
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return calls


def run_ui(tmp_path: Path, *args: str) -> Result:
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    return CliRunner().invoke(cli, ["--database", url, "ui", *args])


def test_non_loopback_without_authentication_is_refused(started: list[Any], tmp_path: Path) -> None:
    result = run_ui(tmp_path, "--host", "0.0.0.0")
    assert result.exit_code == 1
    assert "refusing to serve the UI on 0.0.0.0 without authentication" in result.output
    assert "--auth-header X-Forwarded-User" in result.output
    assert started == []
    for host in ("192.168.1.20", "::", "triage.example.org"):
        assert run_ui(tmp_path, "--host", host).exit_code == 1
    assert started == []


def test_loopback_needs_no_login(started: list[Any], tmp_path: Path) -> None:
    for host in ("127.0.0.1", "::1", "localhost"):
        result = run_ui(tmp_path, "--host", host)
        assert result.exit_code == 0, result.output
    assert [env["TRIAGE_UI_AUTH"] for _argv, env in started] == ["none"] * 3


def test_proxy_header_authentication(started: list[Any], tmp_path: Path) -> None:
    result = run_ui(
        tmp_path,
        "--host",
        "0.0.0.0",
        "--auth-header",
        "X-Forwarded-User",
        "--trusted-proxy",
        "10.0.0.5",
    )
    assert result.exit_code == 0, result.output
    [(argv, env)] = started
    assert "--server.address=0.0.0.0" in argv
    assert env["TRIAGE_UI_AUTH"] == "header"
    assert env["TRIAGE_UI_AUTH_HEADER"] == "X-Forwarded-User"
    assert env["TRIAGE_UI_TRUSTED_PROXIES"] == "10.0.0.5"
    bad = run_ui(tmp_path, "--host", "0.0.0.0", "--auth-header", "X-User: admin")
    assert bad.exit_code == 1 and "not an HTTP header name" in bad.output
    bad = run_ui(tmp_path, "--host", "0.0.0.0", "--auth-header", "X-U", "--trusted-proxy", "me")
    assert bad.exit_code == 1 and "trusted proxy 'me'" in bad.output


def test_oidc_from_streamlit_secrets(started: list[Any], tmp_path: Path) -> None:
    secrets = tmp_path / "secrets.toml"
    secrets.write_text(OIDC_SECRETS, encoding="utf-8")
    result = run_ui(tmp_path, "--host", "0.0.0.0", "--secrets", str(secrets))
    assert result.exit_code == 0, result.output
    [(argv, env)] = started
    assert env["TRIAGE_UI_AUTH"] == "oidc"
    assert f"--secrets.files={secrets}" in argv
    # An [auth] section without a provider is not a login.
    secrets.write_text('[auth]\nredirect_uri = "https://x/oauth2callback"\n', encoding="utf-8")
    assert run_ui(tmp_path, "--host", "0.0.0.0", "--secrets", str(secrets)).exit_code == 1


def test_stacks_come_from_the_command_line_and_ui_toml(started: list[Any], tmp_path: Path) -> None:
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    for name in ("a.toml", "b.toml", "c.toml"):
        (stacks / name).write_text('[server]\nmodel = "m.gguf"\n', encoding="utf-8")
    config = tmp_path / "ui.toml"
    config.write_text('[ui]\nstacks = ["stacks/[ab].toml"]\n', encoding="utf-8")
    result = run_ui(tmp_path, "--config", str(config), "--stack", str(stacks / "c.toml"))
    assert result.exit_code == 0, result.output
    [(_argv, env)] = started
    offered = stack_choices(UiSettings.from_env(env))
    assert [choice.label for choice in offered] == ["a.toml", "b.toml", "c.toml"]
    # A file an administrator adds to a configured glob shows up without a restart.
    (stacks / "b2.toml").write_text('[server]\nmodel = "m.gguf"\n', encoding="utf-8")
    (stacks / "bb.toml").write_text('[server]\nmodel = "m.gguf"\n', encoding="utf-8")
    offered = stack_choices(UiSettings.from_env(env))
    assert [choice.label for choice in offered] == ["a.toml", "b.toml", "c.toml"]
    config.write_text('[ui]\nstacks = ["stacks/*.toml"]\n', encoding="utf-8")
    assert run_ui(tmp_path, "--config", str(config)).exit_code == 0
    offered = stack_choices(UiSettings.from_env(started[-1][1]))
    assert len(offered) == 5 and offered[0].text.startswith("[server]")
    missing = run_ui(tmp_path, "--stack", str(tmp_path / "nope.toml"))
    assert missing.exit_code == 1 and "nope.toml: no such file" in missing.output
    config.write_text('[ui]\nstacks = "one.toml"\n', encoding="utf-8")
    bad = run_ui(tmp_path, "--config", str(config))
    assert bad.exit_code == 1 and "[ui] stacks must be a list of strings" in bad.output


# --------------------------------------------------------------------------- the app


@pytest.fixture
def kb_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    store = Store(url)
    try:
        import_paths(store, [REPO / "incidents"])
    finally:
        store.close()
    monkeypatch.setenv("TRIAGE_DATABASE_URL", url)
    for name in (
        "TRIAGE_UI_AUTH",
        "TRIAGE_UI_AUTH_HEADER",
        "TRIAGE_UI_TRUSTED_PROXIES",
        "TRIAGE_UI_STACKS",
    ):
        monkeypatch.delenv(name, raising=False)
    yield url
    data.forget_stores()


def run_app(user: dict[str, Any] | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    if user is not None:
        at.user = user
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def shows_incidents(at: AppTest) -> bool:
    return any(REFERENCE in str(df.value.to_dict()) for df in at.dataframe) or any(
        "Incidents" == str(t.value) for t in at.title
    )


def test_header_mode_refuses_requests_without_the_header_or_from_elsewhere(
    kb_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIAGE_UI_AUTH", "header")
    monkeypatch.setenv("TRIAGE_UI_AUTH_HEADER", "X-Forwarded-User")
    monkeypatch.setenv("TRIAGE_UI_TRUSTED_PROXIES", "10.0.0.5")

    monkeypatch.setattr(gate, "request_identity", lambda: ({}, "10.0.0.5"))
    at = run_app()
    assert [e.value for e in at.error] == [
        "Not authenticated: the proxy sent no X-Forwarded-User header."
    ]
    assert not shows_incidents(at)

    monkeypatch.setattr(
        gate, "request_identity", lambda: ({"X-Forwarded-User": "alice"}, "192.168.7.7")
    )
    at = run_app()
    assert [e.value for e in at.error] == [
        "This UI only accepts requests through its authenticating proxy."
    ]
    assert not shows_incidents(at)

    monkeypatch.setattr(
        gate, "request_identity", lambda: ({"X-Forwarded-User": "alice"}, "10.0.0.5")
    )
    at = run_app()
    assert not at.error
    assert shows_incidents(at)
    assert "Signed in as alice" in [c.value for c in at.sidebar.caption]


def test_oidc_mode_shows_only_a_login_until_signed_in(
    kb_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIAGE_UI_AUTH", "oidc")
    at = run_app({"is_logged_in": False})
    assert [b.label for b in at.button] == ["Log in"]
    assert not shows_incidents(at)
    at = run_app({"is_logged_in": True, "email": "bob@example.org"})
    assert shows_incidents(at)
    assert "Signed in as bob@example.org" in [c.value for c in at.sidebar.caption]
    assert "Log out" in [b.label for b in at.sidebar.button]


def test_new_triage_offers_only_configured_stacks(
    kb_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("views/new_triage.py").run()
    assert not at.exception
    # Nothing to type a binary or arguments into; without a configured stack, no run.
    assert not [t for t in at.text_area if t.key == "triage_stack_text"]
    assert not [t for t in at.text_input if t.key == "triage_stack_base"]
    assert any("No stack is configured" in w.value for w in at.warning)
    [run] = [b for b in at.button if b.label == "Run triage"]
    assert run.disabled

    stack = tmp_path / "gemma.toml"
    stack.write_text('[server]\nbinary = "/opt/llama/llama-server"\nmodel = "m.gguf"\n')
    monkeypatch.setenv("TRIAGE_UI_STACKS", str(stack))
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.switch_page("views/new_triage.py").run()
    assert at.selectbox(key="triage_stack").options == ["gemma.toml"]
    assert any("/opt/llama/llama-server" in c.value for c in at.code)
    [run] = [b for b in at.button if b.label == "Run triage"]
    assert not run.disabled


def test_ui_toml_sets_the_proxy_header_and_its_addresses_and_the_command_line_wins(
    tmp_path: Path,
) -> None:
    """`auth_header` and `trusted_proxies` from ui.toml let the UI serve off loopback behind
    that proxy; `--auth-header` / `--trusted-proxy` on the command line replace them; an
    unknown key or a wrong type is refused naming the file and the key."""
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "a.toml").write_text("", encoding="utf-8")
    config = tmp_path / "ui.toml"
    config.write_text(
        '[ui]\nauth_header = "X-Forwarded-User"\ntrusted_proxies = ["10.0.0.5"]\n'
        'stacks = ["stacks/a.toml"]\n',
        encoding="utf-8",
    )
    settings = ui.resolve_settings("0.0.0.0", config_file=config, secrets=None)
    assert settings.auth == "header" and settings.header == "X-Forwarded-User"
    assert settings.trusted_proxies == ("10.0.0.5",)
    assert settings.stacks == (str(tmp_path / "stacks" / "a.toml"),)
    overridden = ui.resolve_settings(
        "0.0.0.0",
        config_file=config,
        auth_header="X-Remote-User",
        trusted_proxies=["10.0.0.6"],
    )
    assert (overridden.header, overridden.trusted_proxies) == ("X-Remote-User", ("10.0.0.6",))
    config.write_text('[ui]\nauth_header = "X-User"\nport = 1\n', encoding="utf-8")
    with pytest.raises(UiConfigError, match=r"ui\.toml: \[ui\]: unknown key\(s\) port"):
        ui.resolve_settings("127.0.0.1", config_file=config)
    config.write_text("[ui]\nauth_header = 7\n", encoding="utf-8")
    with pytest.raises(UiConfigError, match=r"ui\.toml: \[ui\] auth_header must be a string"):
        ui.resolve_settings("127.0.0.1", config_file=config)
