"""``POST /v1/recreate`` — ``sparkctl recreate``: replace the container vLLM runs in with one made from the config
(docker-exec: when preflight reports the container drifted from ``[container]``). Only while vLLM is stopped
(``sparkctl stop`` first); what was installed into the old container by hand is lost. The next start runs in
the new container.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sparkd.commands.base import NoParams, Reply, ok, refused
from sparkd.commands.command import Cli, Command

if TYPE_CHECKING:
    from sparkd.commands.port import Control

Request = NoParams


async def execute(control: Control, request: Request) -> Reply:
    if control.running() or not control.stopped():
        return refused("vLLM runs: stop it first (`sparkctl stop`), then recreate its container", control.status())
    done, sentence = await control.recreate()
    return ok({"recreated": sentence}) if done else refused(sentence, control.status())


def render(result: Mapping[str, Any]) -> str:
    return f"recreate: {result['recreated']}"


COMMAND = Command("recreate", "POST", Request, execute, render, cli=Cli(
    help="Replace vLLM's container with one made from the config (while vLLM is stopped).", timeout_s=300),
    root_only=True)  # the control socket, uid 0: a group member must not replace the container vLLM runs in
