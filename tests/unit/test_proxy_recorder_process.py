"""The proxy's recorder in a child process (`RecorderProcess`): the same rows as the
in-process writer, metrics and the auto-diagnose hook in the parent, the child at idle CPU
priority, bounded queue, a child killed mid-run (noticed, counted, the proxy keeps
forwarding; a new process on the same spool stores nothing twice and loses nothing that
reached the spool), no process left behind, the CLI's --recorder option; PostgreSQL replicas.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from proxy_fakes import FakeUpstream, raw_record
from sqlmodel import select

from kb.models import Incident, LiveExchange, LiveSignature
from kb.repo import live
from kb.repo.store import Store
from triage.proxy import (
    ProxyApp,
    ProxyConfig,
    ProxyMetrics,
    Recorder,
    RecorderProcess,
    RecorderProcessError,
    serving,
)
from triage.proxy.grouping import OpeningRules


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class FlagStore:
    """A store factory the child process can unpickle: the database is up while the flag
    file exists, else an unreachable PostgreSQL (the child spools)."""

    def __init__(self, url: str, flag: Path) -> None:
        self.url, self.flag = url, flag
        self.down = f"postgresql+psycopg://nobody@127.0.0.1:{_closed_port()}/none"

    def __call__(self, _url: str | None) -> Store:
        return Store(self.url if self.flag.exists() else self.down)


class FailingStore:
    """A store factory that fails at start in a way the recorder does not expect."""

    def __init__(self, exit_code: int | None = None) -> None:
        self.exit_code = exit_code

    def __call__(self, _url: str | None) -> Store:
        if self.exit_code is not None:
            os._exit(self.exit_code)
        raise RuntimeError("store factory broken on purpose")


def _records(prefix: str, n: int, at: float) -> list[dict[str, Any]]:
    """n exchanges, every other one answered empty (a failure), 1 ms apart."""
    return [
        raw_record(f"{prefix}-{i:03d}", "" if i % 2 else "A complete answer.", at=at + i * 0.001)
        for i in range(n)
    ]


def _rows(url: str) -> list[dict[str, Any]]:
    store = Store(url, migrate=False)
    try:
        with store.session(readonly=True) as session:
            found = session.exec(select(LiveExchange).order_by(LiveExchange.key)).all()
            return [
                {
                    **row.model_dump(exclude={"id", "body"}),
                    "body": live.decompress_body(row.body),
                }
                for row in found
            ]
    finally:
        store.close()


def _gone(pid: int) -> bool:
    """No such process (or only a zombie left for init to reap: it runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] in "ZX"


@pytest.fixture
def processes() -> Iterator[list[RecorderProcess]]:
    """Every RecorderProcess a test starts is stopped, also when the test fails."""
    started: list[RecorderProcess] = []
    yield started
    for recorder in started:
        recorder.stop()


def _process(
    started: list[RecorderProcess], url: str | None, spool: Path, **options: Any
) -> RecorderProcess:
    recorder = RecorderProcess(url, spool_path=spool, flush_seconds=0.02, **options)
    started.append(recorder)
    return recorder


# --------------------------------------------------------------------------- same rows


def test_the_process_stores_the_same_rows_and_incident_as_the_thread(
    tmp_path: Path, processes: list[RecorderProcess]
) -> None:
    records = _records("k", 12, time.time() - 5)
    urls = {name: f"sqlite:///{tmp_path / (name + '.db')}" for name in ("thread", "process")}
    thread = Recorder(urls["thread"], spool_path=tmp_path / "t.jsonl", replica="r")
    process = _process(processes, urls["process"], tmp_path / "p.jsonl", replica="r")
    for recorder in (thread, process):
        recorder.start()
        for record in records:
            assert recorder.submit(record)
        recorder.flush(len(records))
        recorder.stop()
    thread_rows, process_rows = _rows(urls["thread"]), _rows(urls["process"])
    assert len(process_rows) == 12 and sum(r["failed"] for r in process_rows) == 6
    assert process_rows == thread_rows  # every column, the decompressed body included
    assert process.written == thread.written == 12
    assert [o["signature"] for o in process.opened] == ["empty-content|2xx"]
    assert [o["slug"] for o in process.opened] == [o["slug"] for o in thread.opened]
    for url in urls.values():
        store = Store(url, migrate=False)
        try:
            with store.session(readonly=True) as session:
                (incident,) = session.exec(select(Incident)).all()
                assert (
                    incident.title
                    == "Live: empty-content from fake-model.gguf (chat.json requests)"
                )
        finally:
            store.close()


# --------------------------------------------------------------------------- parent side


@pytest.fixture
def upstream() -> Iterator[str]:
    with serving(FakeUpstream()) as server:
        yield server.url


def test_metrics_and_the_incident_hook_live_in_the_parent(
    upstream: str, tmp_path: Path, processes: list[RecorderProcess]
) -> None:
    """/metrics of the proxy shows what the child classified; on_incident runs in this
    process (auto-diagnose must not run in the SCHED_IDLE child)."""
    calls: list[tuple[int, str]] = []
    metrics = ProxyMetrics()
    recorder = _process(
        processes,
        f"sqlite:///{tmp_path / 'kb.db'}",
        tmp_path / "spool.jsonl",
        metrics=metrics,
        on_incident=lambda incident: calls.append((os.getpid(), incident["slug"])),
        # 8 exchanges are enough here: the opening rules cross into the child too.
        opening=OpeningRules(min_exchanges=8),
    )
    app = ProxyApp(
        ProxyConfig(upstream, identity_refresh_seconds=0), recorder=recorder, metrics=metrics
    )
    with serving(app) as proxy:
        assert recorder.pid is not None and recorder.pid != os.getpid()
        assert os.sched_getscheduler(recorder.pid) == os.SCHED_IDLE
        for task in os.listdir(f"/proc/{recorder.pid}/task"):  # every thread of the child
            assert os.sched_getscheduler(int(task)) == os.SCHED_IDLE
        for i in range(8):
            model = "empty" if i % 2 else "ok"
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
            reply = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=30)
            assert reply.status_code == 200
        recorder.flush(8)
        text = httpx.get(f"{proxy.url}/metrics", timeout=30).text
    assert not recorder.is_alive() and _gone(recorder.pid)  # the lifespan stopped it
    failures = 'triage_proxy_failures_total{model="fake-model.gguf",signature="empty-content|2xx"}'
    assert f"{failures} 4.0" in text
    assert 'triage_proxy_exchanges_total{model="fake-model.gguf"} 8.0' in text
    assert 'triage_proxy_tokens_total{kind="prompt",model="fake-model.gguf"} 56.0' in text
    accepted = 'triage_proxy_draft_tokens_total{kind="accepted",model="fake-model.gguf"}'
    assert f"{accepted} 24.0" in text
    opened = 'triage_proxy_incidents_opened_total{model="fake-model.gguf",signature="empty-conte'
    assert f'{opened}nt|2xx"}} 1.0' in text
    assert calls == [(os.getpid(), recorder.opened[0]["slug"])]
    assert recorder.written == 8


def test_stop_leaves_no_process_and_a_second_stop_is_harmless(
    tmp_path: Path, processes: list[RecorderProcess]
) -> None:
    recorder = _process(processes, f"sqlite:///{tmp_path / 'kb.db'}", tmp_path / "s.jsonl")
    recorder.start()
    pid = recorder.pid
    assert pid is not None and recorder.is_alive() and not _gone(pid)
    assert recorder.submit(raw_record("last", "An answer.", at=time.time()))
    recorder.stop()  # no flush: stop writes what is queued
    assert not recorder.is_alive() and _gone(pid)
    recorder.stop()
    assert [r["key"] for r in _rows(f"sqlite:///{tmp_path / 'kb.db'}")] == ["last"]
    assert not recorder.submit(raw_record("after", "An answer.", at=time.time()))


def test_a_full_queue_drops_and_says_so(tmp_path: Path, processes: list[RecorderProcess]) -> None:
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    recorder = _process(processes, url, tmp_path / "s.jsonl", queue_size=3)
    now = time.time()
    accepted = [recorder.submit(r) for r in _records("q", 5, now)]  # child not started yet
    assert accepted == [True, True, True, False, False]
    record = raw_record("big", "An answer.", at=now)
    size = len(record["request_body"]) + len(record["response_chunks"][0])
    by_bytes = _process(processes, url, tmp_path / "s2.jsonl", queue_bytes=2 * size)
    assert [by_bytes.submit(raw_record(f"b{i}", "An answer.", at=now)) for i in range(3)] == [
        True,
        True,
        False,
    ]
    recorder.start()
    recorder.flush(3)
    assert recorder.submit(raw_record("later", "An answer.", at=now))  # room again
    recorder.flush(4)
    assert [r["key"] for r in _rows(url)] == ["later", "q-000", "q-001", "q-002"]


# --------------------------------------------------------------------------- faults


def test_a_child_that_cannot_start_is_a_clear_error_and_leaves_nothing(
    tmp_path: Path, processes: list[RecorderProcess]
) -> None:
    broken = _process(
        processes, "sqlite:///x.db", tmp_path / "s.jsonl", store_factory=FailingStore()
    )
    with pytest.raises(RecorderProcessError, match="could not start: RuntimeError: store fac"):
        broken.start()
    assert broken.pid is not None and _gone(broken.pid)
    dead = _process(
        processes, "sqlite:///x.db", tmp_path / "s.jsonl", store_factory=FailingStore(3)
    )
    with pytest.raises(RecorderProcessError, match=r"exited \(status 3\) before it was ready"):
        dead.start()
    assert not dead.submit(raw_record("x", "An answer.", at=time.time()))


def test_the_database_password_is_never_logged_and_an_unreachable_database_spools(
    tmp_path: Path, processes: list[RecorderProcess], caplog: pytest.LogCaptureFixture
) -> None:
    password = "pw-0123456789-secret"
    url = f"postgresql+psycopg://triage:{password}@127.0.0.1:{_closed_port()}/kb"
    recorder = _process(processes, url, tmp_path / "s.jsonl", retry_seconds=0.2)
    with caplog.at_level(logging.INFO, logger="triage.proxy"):
        recorder.start()
        assert recorder.database_up_at_start is False
        for record in _records("d", 3, time.time()):
            assert recorder.submit(record)
        recorder.flush(3)
        assert recorder.spooled_count() == 3
        recorder.stop()
    assert "database unavailable at start" in caplog.text  # the child's log, in the parent
    assert password not in caplog.text
    assert password not in (tmp_path / "s.jsonl").read_text()
    assert json.dumps(recorder.metrics.exposition().decode()).count(password) == 0


def test_a_child_killed_mid_run_is_noticed_and_the_proxy_keeps_forwarding(
    upstream: str,
    tmp_path: Path,
    processes: list[RecorderProcess],
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = ProxyMetrics()
    recorder = _process(
        processes, f"sqlite:///{tmp_path / 'kb.db'}", tmp_path / "s.jsonl", metrics=metrics
    )
    app = ProxyApp(
        ProxyConfig(upstream, identity_refresh_seconds=0), recorder=recorder, metrics=metrics
    )
    body = {"model": "ok", "messages": [{"role": "user", "content": "hi"}]}
    with caplog.at_level(logging.WARNING, logger="triage.proxy"), serving(app) as proxy:
        assert httpx.post(f"{proxy.url}/v1/chat/completions", json=body).status_code == 200
        recorder.flush(1)
        assert recorder.pid is not None
        os.kill(recorder.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while recorder.submit(raw_record(f"x{time.monotonic()}", "A.", at=time.time())):
            assert time.monotonic() < deadline, "the parent did not notice the dead child"
            time.sleep(0.05)
        replies = [
            httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=30) for _ in range(3)
        ]
        text = httpx.get(f"{proxy.url}/metrics").text
    assert [r.status_code for r in replies] == [200, 200, 200]
    (dropped_text,) = re.findall(r"^triage_proxy_recording_dropped_total (\S+)$", text, re.M)
    dropped = float(dropped_text)
    assert dropped == 3 + recorder.lost  # the three forwarded after, and those in flight
    warnings = [r for r in caplog.records if "recorder process exited" in r.getMessage()]
    assert len(warnings) == 1 and "status -9" in warnings[0].getMessage()
    assert _gone(recorder.pid)


def test_kill_9_mid_run_then_a_new_process_on_the_same_spool_loses_and_repeats_nothing(
    tmp_path: Path, processes: list[RecorderProcess]
) -> None:
    """The database is down (the child spools) while exchanges keep coming; it comes back
    (the child replays the spool and writes) and the child is killed with SIGKILL in the
    middle of that; a new RecorderProcess on the same spool stores every exchange that had
    reached the spool or the database, each exactly once."""
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    Store(url).close()  # migrated: rows can be read while the database is "down"
    flag = tmp_path / "database-up"
    spool = tmp_path / "spool.jsonl"
    first = _process(processes, url, spool, store_factory=FlagStore(url, flag), batch_size=4)
    first.start()
    assert first.database_up_at_start is False
    stop = threading.Event()
    now = time.time()

    def feed() -> None:
        for i, record in enumerate(_records("b", 2000, now)):
            if stop.is_set() or not first.submit(record):
                return
            if i % 8 == 7:
                time.sleep(0.005)

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        deadline = time.monotonic() + 60
        while first.spooled_count() < 12:
            assert time.monotonic() < deadline, "nothing was spooled"
            time.sleep(0.02)
        flag.touch()  # the database is back: the child replays the spool, then writes
        while not _rows(url):
            assert time.monotonic() < deadline, "nothing was written"
            time.sleep(0.01)
        assert first.pid is not None
        os.kill(first.pid, signal.SIGKILL)  # mid-run: records still arriving and queued
    finally:
        stop.set()
        feeder.join()
    first.stop()
    assert _gone(first.pid)
    written = {r["key"] for r in _rows(url)}
    spooled = set()
    for line in spool.read_text().splitlines():
        try:
            spooled.add(json.loads(line)["row"]["key"])
        except ValueError:
            pass  # a line the kill cut: it never reached the spool whole
    assert written and first.lost > 0  # killed with exchanges in flight
    second = _process(processes, url, spool, store_factory=FlagStore(url, flag))
    second.start()
    later = _records("c", 4, now + 10)
    for record in later:
        assert second.submit(record)
    second.flush(4)
    second.stop()
    keys = [r["key"] for r in _rows(url)]
    assert len(keys) == len(set(keys))  # nothing twice
    assert set(keys) == written | spooled | {r["key"] for r in later}  # nothing lost
    assert second.spooled_count() == 0 and second.lost == 0


def test_a_parent_that_vanishes_does_not_leave_its_recorder_behind(tmp_path: Path) -> None:
    """The proxy process killed with SIGKILL (no atexit, no stop): its recorder writes what
    it had and exits by itself."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from proxy_fakes import raw_record\n"
        "from triage.proxy import RecorderProcess\n"
        "if __name__ == '__main__':\n"
        f"    r = RecorderProcess('sqlite:///{tmp_path / 'kb.db'}',\n"
        f"        spool_path={str(tmp_path / 's.jsonl')!r}, retry_seconds=0.2)\n"
        "    r.start()\n"
        "    r.submit(raw_record('orphan', 'An answer.', at=time.time()))\n"
        "    r.flush(1)\n"
        "    print(r.pid, flush=True)\n"
        "    time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        parent.kill()
        parent.wait(30)
        deadline = time.monotonic() + 60
        while not _gone(child):
            assert time.monotonic() < deadline, "the recorder outlived its proxy"
            time.sleep(0.1)
    finally:
        parent.kill()
        parent.wait(30)
    assert [r["key"] for r in _rows(f"sqlite:///{tmp_path / 'kb.db'}")] == ["orphan"]


# --------------------------------------------------------------------------- CLI


def _proxy_command(
    upstream: str, tmp_path: Path, *extra: str
) -> tuple[subprocess.Popen[bytes], int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    env = {**os.environ, "TRIAGE_DATABASE_URL": f"sqlite:///{tmp_path / 'kb.db'}"}
    argv = [sys.executable, "-m", "triage.cli", "proxy", "--upstream", upstream]
    argv += ["--listen", f"127.0.0.1:{port}", "--spool", str(tmp_path / "s.jsonl"), *extra]
    process = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=30)
            return process, port
        except httpx.ConnectError:
            assert process.poll() is None, "the proxy exited"
            assert time.monotonic() < deadline, "the proxy did not start"
            time.sleep(0.2)


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                found.append(int(entry))
    return found


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_the_command_records_in_either_mode_and_ctrl_c_on_the_group_stops_cleanly(
    upstream: str, tmp_path: Path, mode: str
) -> None:
    """Ctrl-C in a terminal reaches the whole process group, the recorder process too: the
    proxy still stops cleanly, with the exchange written and no process left."""
    process, port = _proxy_command(upstream, tmp_path, "--recorder", mode)
    try:
        children = _children(process.pid)
        idle = [pid for pid in children if os.sched_getscheduler(pid) == os.SCHED_IDLE]
        assert len(idle) == (1 if mode == "process" else 0)  # the recorder process
        body = {"model": "empty", "messages": [{"role": "user", "content": "x"}]}
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=30)
        assert reply.status_code == 200
    finally:
        os.killpg(process.pid, signal.SIGINT)
        output = process.communicate(timeout=60)[0].decode()
    assert process.returncode == 0, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    deadline = time.monotonic() + 30  # multiprocessing's resource tracker exits on EOF
    while not all(_gone(child) for child in children):
        left = [Path(f"/proc/{c}/cmdline").read_bytes() for c in children if not _gone(c)]
        assert time.monotonic() < deadline, left
        time.sleep(0.1)
    (row,) = _rows(f"sqlite:///{tmp_path / 'kb.db'}")
    assert row["failed"] and row["signature"] == "empty-content|2xx"


def test_help_documents_both_recorders() -> None:
    from click.testing import CliRunner

    from triage.cli import cli

    result = CliRunner().invoke(cli, ["proxy", "--help"])
    assert result.exit_code == 0
    assert "--recorder [process|thread]" in result.output
    assert "SCHED_IDLE" in result.output


# --------------------------------------------------------------------------- PostgreSQL


@pytest.mark.postgres
def test_two_recorder_processes_on_postgres_open_exactly_one_incident(
    postgres_cluster: Any, tmp_path: Path, processes: list[RecorderProcess]
) -> None:
    url = postgres_cluster.new_database()
    Store(url).close()  # migrated once, before the replicas start
    replicas = [
        _process(processes, url, tmp_path / f"{name}.jsonl", replica=name, batch_size=4)
        for name in ("replica-a", "replica-b")
    ]
    for recorder in replicas:
        recorder.start()
    now = time.time()
    for i in range(24):
        for recorder in replicas:
            content = "" if i % 2 else "A complete and useful answer to the question."
            recorder.submit(raw_record(f"{recorder.replica}-{i:03d}", content, at=now + i * 0.001))
    for recorder in replicas:
        recorder.flush(24)
        recorder.stop()
    store = Store(url, migrate=False)
    try:
        with store.session(readonly=True) as session:
            incidents = session.exec(select(Incident)).all()
            signatures = session.exec(select(LiveSignature)).all()
            total = live.count_exchanges(session)
    finally:
        store.close()
    assert total == 48
    assert len(incidents) == 1 and len(signatures) == 1
    assert sum(len(r.opened) for r in replicas) == 1


def test_stop_drains_at_normal_priority(
    tmp_path: Path, processes: list[RecorderProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At stop() the proxy no longer serves: the child is put back to normal scheduling so
    a busy host cannot starve the final drain past the stop timeout."""
    from triage.proxy import recorder_process

    seen: list[tuple[int, int, bool]] = []

    def restore(pid: int | str = "self") -> bool:
        done = real(pid)
        seen.append((int(pid), os.sched_getscheduler(int(pid)), done))
        return done

    real = recorder_process.restore_priority
    monkeypatch.setattr(recorder_process, "restore_priority", restore)
    recorder = _process(processes, f"sqlite:///{tmp_path / 'kb.db'}", tmp_path / "s.jsonl")
    recorder.start()
    assert recorder.pid is not None
    assert os.sched_getscheduler(recorder.pid) == os.SCHED_IDLE
    assert recorder.submit(raw_record("x", "An answer.", at=time.time()))
    recorder.stop()
    assert [pid for pid, _, _ in seen] == [recorder.pid]
    if os.geteuid() == 0:  # raising a priority back needs root (or RLIMIT_NICE)
        assert seen[0][1:] == (os.SCHED_OTHER, True)
    assert [r["key"] for r in _rows(f"sqlite:///{tmp_path / 'kb.db'}")] == ["x"]


def test_summed_metric_updates_give_the_same_metrics_as_one_call_per_exchange() -> None:
    """The child sums a batch's metric updates before sending them (a few updates for the
    parent's thread to apply, not one per exchange); /metrics must read exactly as if every
    exchange had been counted on its own."""
    from triage.proxy.recorder_child import _MetricsRelay

    updates = [
        ("drill", "empty-content|2xx", {"prompt_tokens": 7, "completion_tokens": 3}),
        ("drill", "empty-content|2xx", {"prompt_tokens": 5, "draft_n": 4, "draft_n_accepted": 2}),
        ("drill", "", {"prompt_tokens": 9, "completion_tokens": 0, "draft_n": True}),
        ("other", "", {}),
    ]
    direct, relay, summed = ProxyMetrics(), _MetricsRelay(), ProxyMetrics()
    for model, signature, usage in updates:
        direct.observe_exchange(model, signature, usage)
        relay.observe_exchange(model, signature, usage)
    direct.spooled.inc(2)
    direct.spooled.inc(3)
    direct.incidents.labels("drill", "empty-content|2xx").inc()
    relay.spooled.inc(2)
    relay.spooled.inc(3)
    relay.incidents.labels("drill", "empty-content|2xx").inc()
    calls = relay.take()
    assert len(calls) == 5  # 2 incs + 3 (model, signature) pairs, from 7 updates
    for attr, labels, method, args in calls:
        target: Any = getattr(summed, attr) if attr else summed
        getattr(target.labels(*labels) if labels else target, method)(*args)

    def values(metrics: ProxyMetrics) -> list[str]:  # `_created` lines are timestamps
        return [
            line for line in metrics.exposition().decode().splitlines() if "_created" not in line
        ]

    assert values(summed) == values(direct)
    assert "triage_proxy_tokens_total" in "\n".join(values(summed))
    assert relay.take() == []
