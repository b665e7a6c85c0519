"""What a launch that did not happen means: the runtime's refusal as a failure class and a sentence.

The runtime says why it could not launch (``sparkd.runtime.base.LaunchError``: the engine unavailable, or the exit
status of what it ran); the host may refuse what the launch writes (an ``OSError``). Both are decided here, pure:
an engine that does not answer and a host that refuses a write are waits (``host_unavailable``, no budget spent);
126/127 (not executable, not found) is the config's fault and never retried; anything else is unknown.
"""

from __future__ import annotations

from sparkd.supervisor.failures import Failure, FailureClass

__all__ = ["host_refused", "launch_refused"]

NOT_RUNNABLE = (126, 127)  # the shell's "cannot execute" and "command not found"


def launch_refused(message: str, *, unavailable: bool, exit_code: int | None) -> Failure:
    """The runtime's refusal (``message``: its text) as a failure."""
    if unavailable:
        return Failure.of(FailureClass.host_unavailable, f"The container engine does not answer ({message}); sparkd "
                          "waits for it and launches when it is back", evidence=message, exit_code=exit_code)
    cls = FailureClass.config_error if exit_code in NOT_RUNNABLE else FailureClass.unknown
    return Failure.of(cls, f"The launch failed: {message}", evidence=message, exit_code=exit_code)


def host_refused(why: str, where: str | None, evidence: str) -> Failure:
    """The host refused what the launch writes (``why``: the OS's words, ``where``: the file): a wait."""
    return Failure.of(FailureClass.host_unavailable, f"sparkd cannot launch vLLM: {why} "
                      f"({where or 'the state directory'}); it waits and tries again without spending the restart "
                      "budget.", evidence=evidence)
