"""Shared fixtures: an isolated data directory per test, and the store over SQLite and PostgreSQL.

On a host whose CPU has AMX (or with TRIAGE_CPU_FLAGS naming amx_* flags), llama-server b11434
segfaults in its repacked AMX path while warming up any drill model (llama.cpp#20824): the
session then points LLAMA_SERVER_BIN at a wrapper that adds --no-repack to every server the
tests start, and says so in the report header and in every server log.

PostgreSQL is a real throwaway PostgreSQL 15 cluster started once per session with
initdb/pg_ctl on a free port (as the `postgres` user when running as root, since initdb
refuses root), with a fresh database per test.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_BIN = Path(os.environ.get("TRIAGE_PG_BIN", "/usr/lib/postgresql/15/bin"))
_HOST_WORKAROUND = pytest.StashKey[tuple[Path, str | None, str]]()


def pytest_configure(config: pytest.Config) -> None:
    """On an AMX host, every llama-server of the suite runs with --no-repack (see above)."""
    from triage.drills.host import host_workaround_note, write_workaround_wrapper
    from triage.llama.build import BINARY_ENV, find_server_binary

    note = host_workaround_note()
    if note is None:
        return
    try:
        real = find_server_binary()
    except Exception:  # noqa: BLE001 -- no binary: the integration fixtures skip or fail
        return
    folder = Path(tempfile.mkdtemp(prefix="triage-host-workaround-"))
    wrapper = write_workaround_wrapper(real, folder / "llama-server")
    if wrapper is None:
        shutil.rmtree(folder, ignore_errors=True)
        return
    config.stash[_HOST_WORKAROUND] = (folder, os.environ.get(BINARY_ENV), note)
    os.environ[BINARY_ENV] = str(wrapper)


def pytest_report_header(config: pytest.Config) -> list[str]:
    if _HOST_WORKAROUND not in config.stash:
        return []
    folder, _, note = config.stash[_HOST_WORKAROUND]
    return [f"{note}: every llama-server runs through {folder / 'llama-server'}"]


def pytest_unconfigure(config: pytest.Config) -> None:
    from triage.llama.build import BINARY_ENV

    if _HOST_WORKAROUND not in config.stash:
        return
    folder, previous, _ = config.stash[_HOST_WORKAROUND]
    if previous is None:
        os.environ.pop(BINARY_ENV, None)
    else:
        os.environ[BINARY_ENV] = previous
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _isolated_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test touches the user's data directory or database."""
    home = tmp_path / "triage-home"
    monkeypatch.setenv("TRIAGE_HOME", str(home))
    monkeypatch.delenv("TRIAGE_DATABASE_URL", raising=False)
    monkeypatch.delenv("TRIAGE_ATLAS_PATH", raising=False)  # the shipped atlas only
    return home


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresCluster:
    """A throwaway cluster; `new_database()` hands out a fresh database URL."""

    def __init__(self) -> None:
        self.as_postgres = os.geteuid() == 0
        self.dir = Path(tempfile.mkdtemp(prefix="triage-pg-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        if self.as_postgres:
            entry = pwd.getpwnam("postgres")
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self._run([str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres"])
        self._run(
            [
                str(PG_BIN / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.dir / "server.log"),
                "-o",
                f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off",
                "-w",
                "start",
            ]
        )

    def _run(self, argv: list[str]) -> None:
        if self.as_postgres:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {result.stdout}\n{result.stderr}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"])
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    if not (PG_BIN / "initdb").exists():
        message = f"PostgreSQL 15 not found at {PG_BIN} (make test installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    cluster = PostgresCluster()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database: a SQLite file, or a new database in the test cluster."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'kb.db'}"
    cluster: PostgresCluster = request.getfixturevalue("postgres_cluster")
    return cluster.new_database()


@pytest.fixture
def store(db_url: str):  # type: ignore[no-untyped-def]
    """A migrated Store on `db_url`, disposed after the test."""
    from kb.repo.store import Store

    kb_store = Store(db_url)
    try:
        yield kb_store
    finally:
        kb_store.close()
