"""The shape of every file in the state folder: what a read must find before anything trusts it.

A schema is a table of fields: name → the JSON types it may hold, whether it must be there, and a check that
returns a complaint (or None). Keys a schema does not name are allowed (an older or newer daemon may write
more); a named key of the wrong type, a missing required key, or a value its check refuses makes the whole
file bad. ``bool`` is never accepted where a number is expected (JSON ``true`` is not a PID).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Check = Callable[[Any], "str | None"]
NUMBER = (int, float)
PID_MAX = 1 << 22  # the kernel's ceiling for /proc/sys/kernel/pid_max


class BadShape(ValueError):
    """The data is not of the expected shape; the message names every field at fault."""


@dataclass(frozen=True)
class Field:
    types: tuple[type, ...]
    required: bool = False
    check: Check | None = None


@dataclass(frozen=True)
class Schema:
    what: str  # "instance record": names the file's kind in messages
    fields: Mapping[str, Field] = field(default_factory=dict)

    def problems(self, data: Any) -> list[str]:
        """Every complaint about ``data`` (empty when it has this shape)."""
        if not isinstance(data, dict):
            return [f"expected a JSON object, found {type(data).__name__}"]
        out = []
        for name, spec in self.fields.items():
            if name not in data:
                if spec.required:
                    out.append(f"{name}: missing")
                continue
            complaint = _type_complaint(data[name], spec.types) or (spec.check(data[name]) if spec.check else None)
            if complaint:
                out.append(f"{name}: {complaint}")
        return out

    def validate(self, data: Any) -> dict[str, Any]:
        problems = self.problems(data)
        if problems:
            raise BadShape(f"not a valid {self.what}: " + "; ".join(problems))
        assert isinstance(data, dict)
        return data


def _type_complaint(value: Any, types: tuple[type, ...]) -> str | None:
    if value is None:
        return None if type(None) in types else "null is not allowed"
    if isinstance(value, bool) and bool not in types:
        return f"{value!r} is not a {_names(types)}"
    if isinstance(value, types):
        if isinstance(value, float) and not math.isfinite(value):
            return f"{value} is not a finite number"
        return None
    return f"{_short(value)} is not a {_names(types)}"


def _names(types: tuple[type, ...]) -> str:
    names = {int: "integer", float: "number", str: "string", bool: "boolean", dict: "object", list: "list"}
    return " or ".join(names.get(t, t.__name__) for t in types if t is not type(None))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ---- checks


def pid_check(value: Any) -> str | None:
    if value is None:
        return None
    return None if 1 < value < PID_MAX else f"{value} is not a process ID sparkd may own (2..{PID_MAX - 1})"


def positive(value: Any) -> str | None:
    return None if value is None or value > 0 else f"{value} is not positive"


def not_negative(value: Any) -> str | None:
    return None if value is None or value >= 0 else f"{value} is negative"


def not_empty(value: Any) -> str | None:
    return None if value else "is empty"


def nested(schema: Schema) -> Check:
    """A check for a field holding an object of another schema."""
    def check(value: Any) -> str | None:
        if value is None:
            return None
        problems = schema.problems(value)
        return "; ".join(problems) if problems else None
    return check


def each(schema: Schema) -> Check:
    """A check for a field holding a list of objects of ``schema``."""
    def check(value: Any) -> str | None:
        for n, item in enumerate(value):
            problems = schema.problems(item)
            if problems:
                return f"item {n}: " + "; ".join(problems)
        return None
    return check


def numbers(value: Any) -> str | None:
    bad = [v for v in value if isinstance(v, bool) or not isinstance(v, NUMBER) or not math.isfinite(v)]
    return f"{_short(bad[0])} is not a finite number" if bad else None


OPT_STR = (str, type(None))

# What proctree.ProcessIdentity records at launch: the launch marker, the executable, the command line, the title.
IDENTITY = Schema("process identity", {
    "pid": Field((int,), True, pid_check),
    "create_time": Field(NUMBER, True, positive),
    "marker": Field(OPT_STR),
    "exe": Field(OPT_STR),
    "cmdline": Field((list,)),
    "title": Field(OPT_STR),
})

INSTANCE = Schema("instance record", {
    "runtime": Field((str,), True, not_empty),
    "pid": Field((int,), True, pid_check),
    "create_time": Field(NUMBER, True, positive),
    "config_hash": Field((str,)),
    "container_id": Field(OPT_STR),
    "exec_id": Field(OPT_STR),
    "log_path": Field(OPT_STR),
    "extra": Field((dict,)),
    "identity": Field((dict, type(None)), check=nested(IDENTITY)),
})

STATUS = Schema("status file", {
    "state": Field((str,), True, not_empty),
    "node": Field((str,)),
    "ready": Field((bool,)),
    "pid": Field((int, type(None)), check=pid_check),
    "daemon_pid": Field((int, type(None)), check=pid_check),
    "restarts": Field((int,), check=not_negative),
    "launches": Field((int,), check=not_negative),
    "updated_at": Field(NUMBER, check=positive),
})

# The operator's intent and the restart policy's memory, so a daemon restart honours them (the lead's shell
# writes it; the fields are the ones issue 16 names: a stop, the breaker, the remaining backoff).
STRIKE = Schema("restart strike", {
    "at": Field(NUMBER, True, positive),
    "weight": Field((int,), True, not_negative),
    "class": Field((str,), True, not_empty),
})

# What sparkd.daemon.loop.remembered keeps: the operator's intent, the restart budget, the breaker, the remaining
# backoff.
LIFECYCLE = Schema("lifecycle file", {
    "version": Field((int,), True),
    "intent": Field((str,), True, not_empty),
    "consecutive": Field((int,), check=not_negative),
    "strikes": Field((list,), check=each(STRIKE)),
    "breaker_reason": Field(OPT_STR),
    "backoff_until": Field((int, float, type(None)), check=positive),
    "last_failure": Field((dict, type(None))),
})

SHM_SEGMENT = Schema("shared-memory segment", {
    "name": Field((str,), True, not_empty),
    "dev": Field((int,), True, not_negative),
    "inode": Field((int,), True, positive),
    "noted_at": Field(NUMBER, check=positive),
})

SHM_LEDGER = Schema("shared-memory ledger", {
    "segments": Field((list,), True, each(SHM_SEGMENT)),
})
