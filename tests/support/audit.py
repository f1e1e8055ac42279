"""What the local API server's audit log says about the operator's replicas.

The tests' cluster is started with the audit log on (``hack.cluster up --audit-log``: every
request at Metadata level, written before its response returns). Each replica names itself in
its User-Agent (``mpijob-operator/<identity>``, the identity it writes into the Lease), so the
log says which replica sent what: :func:`lease_terms` rebuilds who held the Lease when, from
the Lease writes the API server accepted, and :func:`writes_outside_terms` lists every write of
a replica the API server received while that replica did not hold it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

#: The tests' cluster's (the benchmarks pass their own cluster's).
AUDIT_LOG = Path(__file__).resolve().parents[2] / ".cluster" / "logs" / "audit.log"
OPERATOR_AGENT = "mpijob-operator/"
WRITES = {"create", "update", "patch", "delete", "deletecollection"}
LEASE_SECONDS = 15


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def events(since: datetime, path: Path = AUDIT_LOG) -> list[dict[str, Any]]:
    """Every audit event of a request received at or after ``since`` (aware UTC)."""
    if not path.exists():
        raise AssertionError(
            f"{path} does not exist: the cluster runs without its audit log "
            "(make cluster-down, and let the tests start it)"
        )
    out = []
    with path.open() as log:
        for line in log:
            event = json.loads(line)
            if event.get("stage") != "ResponseComplete":
                continue
            if _time(event["requestReceivedTimestamp"]) >= since:
                out.append(event)
    return out


@dataclass(frozen=True)
class Term:
    """A replica (its User-Agent) held the Lease from ``start`` until ``end``."""

    agent: str
    start: datetime
    end: datetime


def _ok(event: dict[str, Any]) -> bool:
    return int((event.get("responseStatus") or {}).get("code") or 0) < 300


def _is_lease(event: dict[str, Any], namespace: str) -> bool:
    """A request on a Lease of ``namespace`` (the test's own: it holds only the lock)."""
    ref = event.get("objectRef") or {}
    return ref.get("resource") == "leases" and ref.get("namespace") == namespace


def lease_terms(found: list[dict[str, Any]], namespace: str) -> list[Term]:
    """Who held the Lease when: each accepted Lease write by a replica starts or extends its
    term, which lasts a lease duration after its last write, or until another replica's
    write."""
    writes = sorted(
        (
            (_time(e["stageTimestamp"]), e.get("userAgent", ""))
            for e in found
            if e["verb"] in WRITES and _is_lease(e, namespace) and _ok(e)
        ),
    )
    terms: list[Term] = []
    for at, agent in writes:
        if terms and terms[-1].agent == agent and at <= terms[-1].end:
            terms[-1] = Term(agent, terms[-1].start, at + timedelta(seconds=LEASE_SECONDS))
            continue
        if terms and terms[-1].end > at:
            terms[-1] = Term(terms[-1].agent, terms[-1].start, at)  # taken over (or released)
        terms.append(Term(agent, at, at + timedelta(seconds=LEASE_SECONDS)))
    return terms


def first_write(found: list[dict[str, Any]], agent: str, after: datetime) -> datetime | None:
    """When the API server received ``agent``'s first write (other than a Lease's) at or after
    ``after``."""
    times = [
        _time(e["requestReceivedTimestamp"])
        for e in found
        if e.get("userAgent") == agent
        and e["verb"] in WRITES
        and (e.get("objectRef") or {}).get("resource") != "leases"
        and _time(e["requestReceivedTimestamp"]) >= after
    ]
    return min(times, default=None)


def writes_outside_terms(found: list[dict[str, Any]], namespace: str) -> tuple[list[str], int]:
    """The writes (other than the Lease's) that a replica sent while it did not hold the
    Lease, as ``verb resource/name by agent at time``; and how many writes were checked.

    Checked: every operator's writes in ``namespace``, and the cluster-scoped writes of the
    replicas that spoke there (each reads its Lease there). Other namespaces belong to other
    tests' operators, which may run meanwhile (tests/support/lanes.py)."""
    terms = lease_terms(found, namespace)
    here = {
        str(e.get("userAgent"))
        for e in found
        if (e.get("objectRef") or {}).get("namespace") == namespace
        and str(e.get("userAgent", "")).startswith(OPERATOR_AGENT)
    }
    bad, checked = [], 0
    for e in found:
        agent = e.get("userAgent", "")
        if e["verb"] not in WRITES or not agent.startswith(OPERATOR_AGENT):
            continue
        if _is_lease(e, namespace):
            continue
        where = (e.get("objectRef") or {}).get("namespace")
        if (where and where != namespace) or (not where and agent not in here):
            continue
        checked += 1
        at = _time(e["requestReceivedTimestamp"])
        if not any(t.agent == agent and t.start <= at < t.end for t in terms):
            ref = e.get("objectRef") or {}
            bad.append(
                f"{e['verb']} {ref.get('resource')}/{ref.get('name')} by {agent} at {at:%T.%f}"
            )
    return bad, checked


def writes_by(found: list[dict[str, Any]], prefix: str) -> list[str]:
    """Writes by a User-Agent starting with ``prefix`` (e.g. Kopf's own, which carries no
    replica's name and must write nothing)."""
    return [
        f"{e['verb']} {(e.get('objectRef') or {}).get('resource')} by {e.get('userAgent')}"
        for e in found
        if e["verb"] in WRITES and str(e.get("userAgent", "")).startswith(prefix)
    ]
