"""How a run ended, from what its log said and whether its writer is still there.

    finished  it logged its end (MindFormers' `Training Over!`, the callback's `end` event ...), or its last step is
              the total the log printed (`step:[ 100/100]`)
    died      an error (a traceback, an ERROR line) was its last word, or its writer left before the total, or a
              JSONL stream logged its start and never its end (the callback writes both)
    stopped   its writer left and nothing says whether it got where it was going: never shown as done

`RunEvidence` keeps what a source's events said since its run (last) started; `judge` turns it, the source's last
step and total, and how its writer left into a fate. The tailer asks (`Tailer._fate`) when the writer is gone
(/proc, `tailer.writers`) or, where writers cannot be seen (a network filesystem written from other nodes), when the
silence passed the hang bound: then the fate is a guess, and says so.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from mstail.tailer.alerts.rules import what_happened

FINISHED, DIED, STOPPED = "finished", "died", "stopped"
FATES = (FINISHED, DIED, STOPPED)


class RunEvidence:
    """What a source's events said of its run's end, since the run (last) started."""

    __slots__ = ("started", "end_step", "ended", "error", "error_step", "total", "error_last")

    def __init__(self) -> None:
        self.started = False  # a `start` event (the callback, MindFormers, Megatron write one)
        self.ended = False  # an `end` event
        self.end_step: Optional[int] = None
        self.error: Optional[str] = None  # the line that says what went wrong, of the newest error event
        self.error_step: Optional[int] = None
        self.total: Optional[int] = None  # the total steps a `start` event gave (`total_steps`: the callback's)
        self.error_last = False  # the newest of the end and error events is an error

    def see(self, event: Dict[str, Any]) -> None:
        """Take one stored event of the source."""
        kind, step = event.get("kind"), event.get("step")
        step = step if isinstance(step, int) else None
        if kind in ("start", "resume"):
            total = event.get("total_steps")
            self.__init__()  # type: ignore[misc]  # a new run: what the last one said is over
            self.started = kind == "start"
            self.total = total if isinstance(total, int) and not isinstance(total, bool) and total > 0 else None
        elif kind == "end":
            self.ended, self.end_step, self.error_last = True, step, False
        elif kind == "error":
            self.error = what_happened(str(event.get("message") or "")) or "an error"
            self.error_step, self.error_last = step, True

    def standing_end(self, last_step: Optional[int]) -> bool:
        """An end logged after the last step (a later step means the run went on: another `Model.train`)."""
        return self.ended and not _after(last_step, self.end_step)

    def standing_error(self, last_step: Optional[int]) -> Optional[str]:
        """The error logged after the last step, if one was (an error training went on from is not its end)."""
        return self.error if self.error is not None and not _after(last_step, self.error_step) else None


def _after(last_step: Optional[int], step: Optional[int]) -> bool:
    return last_step is not None and step is not None and last_step > step


def judge(evidence: RunEvidence, last_step: Optional[int], total: Optional[int], jsonl: bool,
          writer_left: bool) -> Optional[Tuple[str, str]]:
    """(fate, why) of a run, or None while it is not over: it is over when it logged its end or its writer left
    (`writer_left`: gone, or judged gone by the time bound)."""
    end = evidence.standing_end(last_step)
    if not end and not writer_left:
        return None
    total = total or evidence.total
    reached = total is not None and last_step is not None and last_step >= total
    error = evidence.standing_error(last_step)
    at = _at(last_step, total)
    # An error standing is a death, unless the run went on to log its end at its last step (an error it finished
    # despite); one logged after the end is a crash all the same.
    if error is not None and (evidence.error_last or not (end and reached)):
        return DIED, f"{error} ({at})"
    if end:
        return FINISHED, f"logged its end ({at})"
    if reached:
        return FINISHED, f"reached its last step ({at})"
    earlier = f"; the last error read: {evidence.error} (step {evidence.error_step})" if evidence.error else ""
    if total is not None:
        return DIED, f"its writer left before the last step ({at}), no end logged{earlier}"
    if jsonl and evidence.started:
        return DIED, f"its writer left after logging its start and no end ({at}){earlier}"
    return STOPPED, f"its writer left ({at}); no end logged and no total to compare with"


def _at(last_step: Optional[int], total: Optional[int]) -> str:
    step = "no step" if last_step is None else f"step {last_step}"
    return f"{step} of {total}" if total is not None else step
