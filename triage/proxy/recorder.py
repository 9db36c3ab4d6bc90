"""The recording half of the proxy: a bounded queue and one background writer thread.

The hot path only calls `Recorder.submit(record)` (a non-blocking `put_nowait`; a full queue
drops the record and counts it in `/metrics`). The writer takes records in batches and, for
each one: builds the exchange the same way captures are built
(`triage.capture.exchange_from_http`: request and response redacted), classifies it with the
same symptom checks (`triage.symptoms.classify`), derives its failure signature, compresses
the body (successes are kept with probability `sample_successes`; failures always), and
writes the batch through `kb.repo.live` in one transaction, where the change detection may open
an incident.

Database unavailable: the batch goes to a local JSONL spool (already redacted, each line
with its idempotency key) and the proxy keeps forwarding. The spool is replayed before the
next batch once the database answers; replayed keys already stored are skipped, so a crash
between a replay's commit and the spool's truncation stores nothing twice.
"""

from __future__ import annotations

import base64
import json
import logging
import queue
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from kb.atlas.refs import add_references
from kb.domain import retrotext
from kb.models import Incident
from kb.repo import live, liveincidents
from kb.repo.store import Store
from triage.atlas.report import incident_references
from triage.capture import CaptureError, exchange_from_http, redact_headers, redact_text
from triage.proxy.grouping import (
    OpeningRules,
    client_limit,
    group_of,
    primary_symptom,
    problem_key,
    request_shape,
)
from triage.proxy.metrics import ProxyMetrics
from triage.proxy.rates import detect, failure_signature, signature_kinds
from triage.symptoms import USER_FACING_KINDS, classify

log = logging.getLogger("triage.proxy")

DEFAULT_QUEUE_SIZE = 10_000
# Queued records hold their bodies in memory: the queue is bounded in bytes too.
DEFAULT_QUEUE_BYTES = 256 * 1024 * 1024
DEFAULT_BATCH_SIZE = 256
CURRENT_WINDOW = timedelta(minutes=10)
TRAILING_WINDOW = timedelta(hours=1)
# The spool is bounded: past this size (a database down for a long time), further exchanges
# are counted in triage_proxy_recording_dropped_total instead of filling the disk.
DEFAULT_MAX_SPOOL_BYTES = 1024 * 1024 * 1024
_STOP = object()


@dataclass
class Prepared:
    """One classified, redacted exchange ready for the store (or the spool)."""

    row: dict[str, Any]
    kinds: list[str]
    example: dict[str, Any] | None  # evidence item for a failing exchange
    usage: dict[str, Any] = field(default_factory=dict)

    def to_line(self) -> str:
        row = dict(self.row)
        row["recorded_at"] = row["recorded_at"].isoformat()
        if row.get("body") is not None:
            row["body"] = base64.b64encode(row["body"]).decode()
        example = None
        if self.example is not None:
            example = {k: v for k, v in self.example.items() if k != "recorded_at"}
        return json.dumps({"row": row, "kinds": self.kinds, "example": example}) + "\n"

    @classmethod
    def from_line(cls, line: str) -> Prepared:
        data = json.loads(line)
        row = dict(data["row"])
        row["recorded_at"] = datetime.fromisoformat(row["recorded_at"])
        if row.get("body") is not None:
            row["body"] = base64.b64decode(row["body"])
        example = data.get("example")
        if example is not None:
            example["recorded_at"] = row["recorded_at"]
        return cls(row=row, kinds=list(data.get("kinds") or []), example=example)


def _usage(response: dict[str, Any] | None) -> dict[str, Any]:
    """Token counts and draft acceptance from a reply's usage/timings (llama-server)."""
    if not isinstance(response, dict):
        return {}
    out: dict[str, Any] = {}
    usage = response.get("usage")
    if isinstance(usage, dict):
        for key in ("prompt_tokens", "completion_tokens"):
            if isinstance(usage.get(key), int):
                out[key] = usage[key]
    timings = response.get("timings")
    if isinstance(timings, dict):
        for key in ("draft_n", "draft_n_accepted"):
            if isinstance(timings.get(key), int):
                out[key] = timings[key]
        if "completion_tokens" not in out and isinstance(timings.get("predicted_n"), int):
            out["completion_tokens"] = timings["predicted_n"]
        if "prompt_tokens" not in out and isinstance(timings.get("prompt_n"), int):
            out["prompt_tokens"] = timings["prompt_n"]
    return out


def _sse_timings(text: str) -> dict[str, Any]:
    """The last `timings`/`usage` of a stream (the reassembled reply may not keep them)."""
    found: dict[str, Any] = {}
    for line in reversed(text.splitlines()):
        if not line.startswith("data:") or "timings" not in line and "usage" not in line:
            continue
        try:
            value = json.loads(line[5:].strip())
        except ValueError:
            continue
        if isinstance(value, dict):
            found = _usage(value)
            if found:
                return found
    return found


@dataclass
class _Classified:
    exchange: dict[str, Any]
    findings: list[dict[str, Any]]
    kinds: list[str]
    usage: dict[str, Any]


def _classify(record: dict[str, Any], body: bytes, transport: bool) -> _Classified:
    """The redacted exchange of a record and its failing user-facing kinds."""
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in record["request_headers"]}
    response_headers = {
        k.decode("latin-1"): v.decode("latin-1") for k, v in record["response_headers"]
    }
    try:
        request = json.loads(record["request_body"] or b"null")
        exchange = exchange_from_http(
            request if isinstance(request, dict) else {"_raw": request},
            None if transport else body,
            status=None if transport else record.get("status"),
            elapsed_ms=record.get("elapsed_ms"),
            timed_out=bool(record.get("timed_out")),
            url=record["path"],
            headers=headers,
            response_headers=response_headers,
            source_file="proxy",
        )
    except (CaptureError, ValueError, RecursionError) as exc:
        # Not a chat exchange the checks can read (malformed JSON, a non-object request):
        # what the upstream answered decides.
        http_status = record.get("status")
        failing = transport or http_status is None or http_status >= 400
        unparsed = {
            "unparsed": redact_text(str(exc))[:500],
            "status": http_status,
            "request_headers": redact_headers(headers),
            "request_text": redact_text(record["request_body"][:4096].decode("utf-8", "replace")),
            "response_text": redact_text(body[:4096].decode("utf-8", "replace")),
        }
        return _Classified(unparsed, [], ["http-error"] if failing else [], {})
    if transport and exchange.error is None and not record.get("timed_out"):
        exchange.error = {
            "message": redact_text(str(record["transport_error"])),
            "type": "transport",
            "code": record.get("status"),
            "in_stream": False,
        }
    if record.get("upstream_truncated"):
        exchange.truncated = True
    findings = classify(exchange)
    kinds = sorted({f.kind for f in findings if not f.passed} & USER_FACING_KINDS)
    if transport and not kinds:
        kinds = ["timeout" if record.get("timed_out") else "http-error"]
    usage = _usage(exchange.response)
    if not usage and record.get("stream"):
        usage = _sse_timings(body.decode("utf-8", "replace"))
    return _Classified(exchange.to_dict(), [f.to_dict() for f in findings], kinds, usage)


def prepare(record: dict[str, Any], *, keep_success: bool, replica: str) -> Prepared:
    """Redact, classify and compress one raw record from the hot path."""
    body = b"".join(record["response_chunks"])
    transport = record.get("transport_error") is not None and record.get("status") in (502, 504)
    status = None if transport else record.get("status")
    identity = record.get("identity") or {}
    classified = _classify(record, body, transport)
    exchange_dict, finding_dicts = classified.exchange, classified.findings
    kinds, usage = classified.kinds, classified.usage
    signature = failure_signature(kinds, status, transport=transport)
    model = identity.get("model") or ""
    if not model and exchange_dict and isinstance(exchange_dict.get("request"), dict):
        model = str(exchange_dict["request"].get("model") or "")
    failed = bool(signature)
    request = exchange_dict.get("request") if isinstance(exchange_dict, dict) else None
    shape = request_shape(str(record["path"]), request, stream=bool(record.get("stream")))
    configured = ""
    if failed and isinstance(exchange_dict, dict):
        configured = client_limit(request, exchange_dict.get("response"), kinds)
    payload = {
        "exchange": exchange_dict,
        # The failed findings only: the passed ones (a dozen per exchange) say nothing
        # the symptoms do not, and were most of an exported live incident's size.
        "findings": [f for f in finding_dicts if not f.get("passed", False)],
        "symptoms": kinds,
        "failed": failed,
        "live_key": record["key"],
        "signature": signature,
        "shape": shape,
        **({"client_limit": configured} if configured else {}),
        "upstream": identity,
        "client": redact_text(record.get("client") or "")[:200],
        "client_disconnected": bool(record.get("client_disconnected")),
    }
    recorded_at = datetime.fromtimestamp(record["at"], tz=timezone.utc)
    keep = failed or keep_success
    row = {
        "key": record["key"],
        "recorded_at": recorded_at,
        "replica": replica[:100],
        "path": record["path"][:200],
        "model": model[:300],
        "client": payload["client"],
        "signature": signature,
        "failed": failed,
        "status": record.get("status"),
        "elapsed_ms": record.get("elapsed_ms"),
        "stream": bool(record.get("stream")),
        "upstream_build": str(identity.get("build") or "")[:100],
        "template_sha256": str(identity.get("template_sha256") or "")[:64],
        "findings": kinds,
        "body": live.compress_body(payload) if keep else None,
        "body_truncated": bool(record.get("body_truncated")),
        "shape": shape[:100],
        "client_limit": configured[:200],
    }
    example = None
    if failed:
        example = {
            "kind": "exchange",
            "summary": f"live exchange {record['key'][:12]} via proxy: {signature}",
            "payload": payload,
            "source": f"proxy:{replica}",
            "recorded_at": recorded_at,
            "brief": _brief(payload, status),
        }
    return Prepared(row=row, kinds=kinds, example=example, usage=usage)


def _brief(payload: dict[str, Any], status: int | None) -> dict[str, Any]:
    """The short form of a failing exchange's evidence (kb.repo.live keeps the first example of
    an incident whole and these for the others): what failed and how the reply ended, the
    body referenced by its live key instead of repeated (same prompt, same reply shape)."""
    exchange = payload.get("exchange") if isinstance(payload.get("exchange"), dict) else {}
    response = exchange.get("response") if isinstance(exchange, dict) else None
    reply: dict[str, Any] = {"status": status}
    choices = response.get("choices") if isinstance(response, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        reply["finish_reason"] = choice.get("finish_reason")
        for key in ("content", "reasoning_content"):
            value = message.get(key) if isinstance(message, dict) else None
            if isinstance(value, str):
                reply[f"{key}_chars"] = len(value)
        reply["tool_calls"] = len(message.get("tool_calls") or []) if message else 0
    usage = response.get("usage") if isinstance(response, dict) else None
    if isinstance(usage, dict):
        reply["usage"] = {k: v for k, v in usage.items() if isinstance(v, int)}
    keep = ("live_key", "signature", "symptoms", "shape", "client_limit", "client", "failed")
    return {
        **{key: payload[key] for key in keep if key in payload},
        "findings": [
            {"kind": f.get("kind"), "reason": f.get("reason")}
            for f in payload.get("findings") or []
        ],
        "reply": reply,
        "body": "not repeated here: stored by the proxy under live_key (liveexchange)",
    }


def spooled_count(spool_path: Path) -> int:
    """Exchanges waiting in a spool file (read under the spool's lock)."""
    if not spool_path.exists():
        return 0
    with FileLock(str(spool_path) + ".lock"):
        with spool_path.open(encoding="utf-8") as handle:
            return sum(1 for line in handle if line.strip())


def _record_size(record: dict[str, Any]) -> int:
    return len(record.get("request_body") or b"") + sum(
        len(chunk) for chunk in record.get("response_chunks") or ()
    )


class Recorder:
    """Queue + writer thread; see the module docstring."""

    def __init__(
        self,
        database_url: str | None,
        *,
        spool_path: Path,
        sample_successes: float = 1.0,
        replica: str = "proxy",
        metrics: ProxyMetrics | None = None,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        queue_bytes: int = DEFAULT_QUEUE_BYTES,
        batch_size: int = DEFAULT_BATCH_SIZE,
        flush_seconds: float = 0.2,
        retry_seconds: float = 2.0,
        current_window: timedelta = CURRENT_WINDOW,
        trailing_window: timedelta = TRAILING_WINDOW,
        on_incident: Callable[[dict[str, Any]], None] | None = None,
        store_factory: Callable[[str | None], Store] = Store,
        rng: random.Random | None = None,
        max_spool_bytes: int = DEFAULT_MAX_SPOOL_BYTES,
        opening: OpeningRules | None = None,
    ) -> None:
        if not 0.0 <= sample_successes <= 1.0:
            raise ValueError("--sample-successes must be between 0 and 1")
        self.opening = opening or OpeningRules()
        self.database_url = database_url
        self.spool_path = Path(spool_path)
        self.sample_successes = sample_successes
        self.replica = replica
        self.metrics = metrics or ProxyMetrics()
        self.batch_size = batch_size
        self.flush_seconds = flush_seconds
        self.retry_seconds = retry_seconds
        self.current_window = current_window
        self.trailing_window = trailing_window
        self.on_incident = on_incident
        self._store_factory = store_factory
        self._rng = rng or random.Random()
        self.max_spool_bytes = max_spool_bytes
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self.queue_bytes = queue_bytes
        self._queued_bytes = 0
        self._bytes_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._store: Store | None = None
        self._lock = FileLock(str(self.spool_path) + ".lock")
        self._last_failure = 0.0
        self.opened: list[dict[str, Any]] = []
        self.written = 0
        self.submitted = 0
        # Records taken off the queue and finished (stored, spooled, or dropped as
        # unreadable), in submission order: the journal deletes what is below this count.
        self.completed = 0

    # ------------------------------------------------------------------ hot path

    def submit(self, record: dict[str, Any]) -> bool:
        """Queue a raw record without blocking; False when the queue is full (dropped)."""
        size = _record_size(record)
        with self._bytes_lock:
            if self._queued_bytes + size > self.queue_bytes:
                return False
            self._queued_bytes += size
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            with self._bytes_lock:
                self._queued_bytes -= size
            return False
        self.submitted += 1
        return True

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> bool:
        """Create the spool's folder and open (migrate) the store; False when the database
        is unavailable now (the writer retries it and spools meanwhile)."""
        self.spool_path.parent.mkdir(parents=True, exist_ok=True)
        # Migrate here, before serving: Alembic is not safe to run from two threads of one
        # process at once. A database that is down now is retried by the writer.
        try:
            self._open_store()
        except (SQLAlchemyError, OSError) as exc:
            log.warning("database unavailable at start (%s): spooling", type(exc).__name__)
            self._store = None
            return False
        return True

    def start(self) -> None:
        if self._thread is not None:
            return
        self.open()
        self._thread = threading.Thread(target=self._run, name="triage-proxy-writer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Write what is queued (or spool it) and stop the writer."""
        if self._thread is None:
            return
        self._queue.put(_STOP)
        self._thread.join(timeout)
        self._thread = None
        if self._store is not None:
            self._store.close()
            self._store = None

    def flush(self, expected: int = 0, timeout: float = 30.0) -> None:
        """Block until every record queued so far has been written or spooled; with
        `expected`, first until that many records were submitted (the proxy hands a record
        over just after the client has its last byte)."""
        deadline = time.monotonic() + timeout
        while self.submitted < expected and time.monotonic() < deadline:
            time.sleep(0.01)
        self._queue.join()

    # ------------------------------------------------------------------ writer

    def _run(self) -> None:
        stopping = False
        while not stopping:
            batch: list[dict[str, Any]] = []
            try:
                item = self._queue.get(timeout=self.retry_seconds)
            except queue.Empty:
                self._replay_if_due()
                continue
            taken = 1
            if item is _STOP:
                stopping = True
            else:
                batch.append(item)
            while not stopping and len(batch) < self.batch_size:
                try:
                    item = self._queue.get(timeout=self.flush_seconds if batch else 0)
                except queue.Empty:
                    break
                taken += 1
                if item is _STOP:
                    stopping = True
                else:
                    batch.append(item)
            try:
                self._process(batch)
            except Exception:  # noqa: BLE001 -- the writer must outlive any one bad batch
                log.exception("recording a batch of %d exchanges failed", len(batch))
            finally:
                self.completed += len(batch)
                for _ in range(taken):
                    self._queue.task_done()

    def _process(self, batch: list[dict[str, Any]]) -> None:
        prepared = []
        with self._bytes_lock:
            self._queued_bytes -= sum(_record_size(record) for record in batch)
        for record in batch:
            keep = self.sample_successes >= 1.0 or self._rng.random() < self.sample_successes
            try:
                item = prepare(record, keep_success=keep, replica=self.replica)
            except Exception:  # noqa: BLE001 -- one unreadable record must not lose the batch
                log.exception("cannot classify exchange %s", record.get("key"))
                continue
            self.metrics.observe_exchange(item.row["model"], item.row["signature"], item.usage)
            prepared.append(item)
        if not self._replay_spool():
            self._spool(prepared)
            return
        if prepared and not self._write_or_spool(prepared):
            return

    def _write_or_spool(self, prepared: list[Prepared]) -> bool:
        try:
            self._write(prepared)
        except (SQLAlchemyError, OSError) as exc:
            log.warning("database unavailable (%s): spooling %d", type(exc).__name__, len(prepared))
            self._drop_store()
            self._spool(prepared)
            return False
        return True

    def _drop_store(self) -> None:
        if self._store is not None:
            try:
                self._store.close()
            except Exception:  # noqa: BLE001 -- closing a broken engine
                pass
            self._store = None

    def _open_store(self) -> Store:
        if self._store is None:
            self._store = self._store_factory(self.database_url)
        return self._store

    # ------------------------------------------------------------------ spool

    def _spool(self, prepared: list[Prepared]) -> None:
        if not prepared:
            return
        written = dropped = 0
        with self._lock:
            size = self.spool_path.stat().st_size if self.spool_path.exists() else 0
            with self.spool_path.open("a", encoding="utf-8") as handle:
                for item in prepared:
                    line = item.to_line()
                    if size + len(line) > self.max_spool_bytes:
                        dropped += 1
                        continue
                    handle.write(line)
                    size += len(line)
                    written += 1
                handle.flush()
        self.metrics.spooled.inc(written)
        if dropped:
            log.error("spool %s is full: %d exchange(s) not recorded", self.spool_path, dropped)
            self.metrics.recording_dropped.inc(dropped)

    def spooled_count(self) -> int:
        return spooled_count(self.spool_path)

    def _replay_if_due(self) -> None:
        if self.spool_path.exists() and self.spool_path.stat().st_size > 0:
            self._replay_spool()

    def _replay_spool(self) -> bool:
        """Write the spooled exchanges (batch by batch, never the whole file in memory);
        True when the spool is empty afterwards."""
        if not self.spool_path.exists() or self.spool_path.stat().st_size == 0:
            return True
        with self._lock:
            unreadable: list[str] = []
            try:
                with self.spool_path.open(encoding="utf-8") as handle:
                    batch: list[Prepared] = []
                    for line in handle:
                        if not line.strip():
                            continue
                        try:
                            batch.append(Prepared.from_line(line))
                        except (ValueError, KeyError, TypeError):
                            unreadable.append(line)  # a line cut by a crash mid-write
                        if len(batch) >= self.batch_size:
                            self._write(batch)
                            batch = []
                    if batch:
                        self._write(batch)
            except (SQLAlchemyError, OSError) as exc:
                log.info("database still unavailable (%s); spool kept", type(exc).__name__)
                self._drop_store()
                return False
            if unreadable:
                # Kept aside, never silently: once, when the spool they came from is emptied.
                log.error(
                    "spool %s: %d unreadable line(s) moved to %s.bad",
                    self.spool_path,
                    len(unreadable),
                    self.spool_path,
                )
                with open(str(self.spool_path) + ".bad", "a", encoding="utf-8") as bad:
                    bad.writelines(unreadable)
            # Only now: a crash before this line replays keys that are already stored,
            # which the unique key turns into no-ops.
            self.spool_path.write_text("", encoding="utf-8")
        return True

    # ------------------------------------------------------------------ store

    def _write(self, prepared: list[Prepared]) -> None:
        store = self._open_store()
        opened: list[dict[str, Any]] = []
        for attempt in range(3):
            try:
                with store.session() as session:
                    opened = self._write_batch(session, prepared)
                break
            except IntegrityError:
                # A replica stored the same signature or key between our read and our
                # write (the advisory lock makes this rare): the retry finds its rows.
                if attempt == 2:
                    raise
        self.written += len(prepared)
        for incident in opened:
            self.metrics.incidents.labels(incident["model"], incident["signature"]).inc()
            self.opened.append(incident)
            if self.on_incident is not None:
                try:
                    self.on_incident(incident)
                except Exception:  # noqa: BLE001 -- a failing hook must not stop recording
                    log.exception("auto-diagnose hook failed for %s", incident["slug"])

    def _write_batch(self, session: Any, prepared: list[Prepared]) -> list[dict[str, Any]]:
        """Insert the batch; then, per problem (model x request shape x primary symptom),
        add its failing exchanges to its incident or run the change detection on it.
        Failures the client configured are recorded only (unless the opening rules say
        otherwise)."""
        inserted = set(live.insert_exchanges(session, [p.row for p in prepared]))
        groups: dict[tuple[str, str, str], list[Prepared]] = defaultdict(list)
        for item in prepared:
            row = item.row
            if not row["failed"] or row["key"] not in inserted:
                continue
            if row["client_limit"] and not self.opening.open_on_client_limits:
                continue
            groups[(row["model"], row["shape"], group_of(row["signature"]))].append(item)
        opened = []
        for (model, shape, group), items in sorted(groups.items()):
            items.sort(key=lambda p: p.row["recorded_at"])
            result = self._problem_batch(session, model, shape, group, items)
            if result is not None:
                opened.append(result)
        return opened

    def _problem_counts(
        self, session: Any, model: str, shape: str, group: str, since: datetime, until: datetime
    ) -> tuple[int, int, dict[str, int]]:
        """(failures of the problem, exchanges of the model x shape, failures by variant)."""
        counts = live.shape_counts(session, model, shape, since, until)
        variants = {sig: k for sig, k in counts.failures.items() if group_of(sig) == group}
        if self.opening.open_on_client_limits:
            for sig, k in counts.configured.items():
                if group_of(sig) == group:
                    variants[sig] = variants.get(sig, 0) + k
        return sum(variants.values()), counts.n, variants

    def _problem_batch(
        self, session: Any, model: str, shape: str, group: str, items: list[Prepared]
    ) -> dict[str, Any] | None:
        until = items[-1].row["recorded_at"] + timedelta(microseconds=1)
        since = until - self.current_window
        k, n, variants = self._problem_counts(session, model, shape, group, since, until)
        k0, n0, _ = self._problem_counts(
            session, model, shape, group, since - self.trailing_window, since
        )
        detection = detect(k, n, k0, n0)
        minutes = int(self.current_window.total_seconds() // 60)
        facts = {
            **detection.to_dict(),
            "as_of": items[-1].row["recorded_at"].isoformat(),
            "window_minutes": minutes,
            "shape": shape,
            "variants": dict(sorted(variants.items())),
        }
        problem = problem_key(group, shape)
        examples = [p.example for p in items if p.example is not None]
        existing = liveincidents.find_problem(session, model, problem)
        if existing is None:  # a row from before problems were recorded
            existing = liveincidents.find_signature(session, model, items[-1].row["signature"])
        if existing is not None:
            self._add_to_problem(session, existing, shape, items, examples)
            liveincidents.update_detection(session, existing, facts)
            return None
        if not detection.alarm or n + n0 < self.opening.min_exchanges:
            return None
        first = self._first_example(
            session, model, items[0].row["signature"], since, examples, shape
        )
        upstream = dict(items[-1].example["payload"].get("upstream") or {})  # type: ignore[index]
        primary = primary_symptom(signature_kinds(group))
        main = max(variants, key=lambda sig: (variants[sig], sig)) if variants else group
        compared = (
            f"trailing {int(self.trailing_window.total_seconds() // 60)} min {k0}/{n0}"
            if n0
            else "no exchange of this shape in the trailing "
            f"{int(self.trailing_window.total_seconds() // 60)} min to compare with"
        )
        what = "new failure" if detection.new else "failure rate rose"
        summary = (
            f"{what}: {primary} ({', '.join(sorted(variants)) or main}) from "
            f"{model or 'unknown model'}, requests shaped {shape}: "
            f"{retrotext.failing_text(facts)}; {compared}; upstream build "
            f"{upstream.get('build') or '?'}, template "
            f"{(upstream.get('template_sha256') or '?')[:12]}"
        )
        # No counts in the title: they change, and the title would keep the first ones.
        title = f"Live: {primary} from {model or 'unknown model'} ({shape} requests)"
        kinds = sorted({kind for p in items for kind in p.kinds})
        sig_row, outcome = liveincidents.open_or_attach(
            session,
            model=model,
            signature=main,
            kinds=kinds,
            title=title,
            summary=summary,
            upstream=upstream,
            detection=facts,
            examples=[*first, *examples],
            opened_by=self.replica,
            shape=shape,
            problem=problem,
        )
        if outcome == "existing":  # a replica opened or attached it first
            self._add_to_problem(session, sig_row, shape, items, examples)
            return None
        for item in items:
            if item.row["signature"] != main:
                liveincidents.add_variant(
                    session,
                    sig_row,
                    signature=item.row["signature"],
                    kinds=item.kinds,
                    shape=shape,
                    opened_by=self.replica,
                )
        if outcome == "attached":  # an open or parked incident of the same family
            log.info("%s of %s: evidence added to incident %s", problem, model, sig_row.incident_id)
            return None
        incident = session.get(Incident, sig_row.incident_id)
        example = examples[-1]["payload"] if examples else {}
        refs = incident_references(example.get("exchange"), kinds, upstream.get("build"))
        add_references(session, incident.id, refs)  # atlas pointers, shown with the incident
        return {
            "slug": incident.slug,
            "model": model,
            "signature": main,
            "problem": problem,
            "detection": facts,
            "example": examples[-1]["payload"] if examples else None,
        }

    def _add_to_problem(
        self,
        session: Any,
        row: Any,
        shape: str,
        items: list[Prepared],
        examples: list[dict[str, Any]],
    ) -> None:
        """Record the batch's symptom variants and examples on the problem's incident."""
        for item in items:
            if item.row["signature"] != row.signature:
                liveincidents.add_variant(
                    session,
                    row,
                    signature=item.row["signature"],
                    kinds=item.kinds,
                    shape=shape,
                    opened_by=self.replica,
                )
        liveincidents.add_examples(session, row, examples)

    def _first_example(
        self,
        session: Any,
        model: str,
        signature: str,
        since: datetime,
        examples: list[dict[str, Any]],
        shape: str | None = None,
    ) -> list[dict[str, Any]]:
        """The earliest failing exchange of the window (of the problem's request shape, not
        one the client configured), when it came in an earlier batch."""
        first = live.first_failing(session, model, signature, since, shape)
        if first is None:
            return []
        key, recorded_at, payload = first
        if payload is None or any(e["payload"].get("live_key") == key for e in examples):
            return []
        return [
            {
                "kind": "exchange",
                "summary": f"live exchange {key[:12]} via proxy: {signature} (first)",
                "payload": payload,
                "source": f"proxy:{self.replica}",
                "recorded_at": recorded_at,
                "brief": _brief(payload, payload.get("exchange", {}).get("status")),
            }
        ]
