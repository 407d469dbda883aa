"""What a stage's end means for the job's files: the one place that decides sweep or compensate."""

from __future__ import annotations

import enum
import uuid

from models import variants
from tasks import artifacts, compensation
from tasks.contract.publish import publish_postprocess
from tasks.runtime import Runtime


class Outcome(enum.Enum):
    """How a stage attempt ended, as far as the job's files are concerned."""

    SKIPPED = "skipped"  # the stage had nothing to do: a redelivery, a stray message
    COMPLETED = "completed"  # this attempt's final transition recorded the success
    OVERTAKEN = "overtaken"  # the final transition found the job no longer running


def settle(rt: Runtime, job_id: uuid.UUID, outcome: Outcome, variants_possible: bool = True) -> None:
    """Tidy the job's files after a stage attempt that got past its failure handling.

    A succeeded job keeps its artifacts and loses only the temp leftovers of an attempt killed
    mid-write (a skipped redelivery after a committed success may be the only chance to sweep
    them). A job canceled or failed (by the client, the reaper) while this attempt rendered
    has orphan files now: compensate it. A skipped message that finds the job not succeeded
    leaves its files alone: whoever moved the job there owns the cleanup.
    """
    if outcome is Outcome.COMPLETED or compensation.is_succeeded(rt, job_id):
        artifacts.sweep_temp(rt.storage, job_id)
        # After the success commit: the job (and its cached followers) asked for variants, a CPU
        # worker makes them; a redelivery asks again for those still pending (the task is idempotent).
        # `variants_possible` False (variants.may_have_waiting): a query per job saved.
        if rt.app is not None and variants_possible:
            with rt.sessions() as s:
                waiting = variants.waiting_jobs(s, job_id)
            for jid in waiting:
                publish_postprocess(rt.app, jid)
    elif outcome is Outcome.OVERTAKEN:
        compensation.compensate_job(rt, job_id)
