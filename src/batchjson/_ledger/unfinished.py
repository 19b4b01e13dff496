"""Unfinished batch jobs hold their batch in its ledger: its requests may still be answered and
billed there, and only that ledger's job row can collect them. So forgetting the batch, or
carrying its account elsewhere (a merge, an export), waits until the job is collected or
cancelled; nothing a job may still bill is ever left behind as a receipt no one collects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .store_jobs import OPEN_STATES


def _unfinished_jobs(jobs: Sequence[Mapping[str, Any]], where: str, then: str) -> str | None:
    """Why ``then`` must wait when any of ``jobs`` (rows with id, provider_job_id, status and
    batch) is unfinished, naming each job and what to do; None when none is."""
    open_jobs = [j for j in jobs if j["status"] in OPEN_STATES]
    if not open_jobs:
        return None
    named = ", ".join(f"{j['id']} (batch {j['batch']!r}, {j['provider_job_id'] or j['status']})"
                      for j in open_jobs)
    return (f"{where} has unfinished batch job(s) {named}: they may still answer, and be "
            f"billed, there. Re-run the batch to collect them, or `batchjson cancel JOB` "
            f"them, first; then {then}")
