"""The step probe in the launch (issue 38), pure: what the launch adds so that vLLM loads ``sparkd-vllm-probe``.

With ``[health] step_probe`` on (the default):

- ``SPARKD_PROBE_DIR`` names the directory the ranks write their step files in: ``<run_dir>/probe`` (tmpfs on a
  packaged install: the files cost no disk write). The runtime makes it before each launch and removes the files
  an earlier launch left (:mod:`sparkd.runtime.probedir`); a container gets it bind-mounted at the same path.
- ``PYTHONPATH`` gets the plugin's directory (:data:`sparkd.vllm_probe.PLUGIN_DIR`, inside sparkd's own package)
  in front of what the environment already has (the image's ENV, ``[container] env``, ``[launch] env``); a container
  gets the directory mounted read-only at the same path. vLLM finds the plugin through its ``.dist-info`` there.
- ``VLLM_PLUGINS``, when the environment sets it (a list of the plugins vLLM may load), gets ``sparkd_probe``
  appended, so the user's list stays what it was plus the probe. When it is unset vLLM loads every plugin it finds,
  the probe among them, and sparkd leaves it unset: setting it would also turn off the image's own plugins of every
  group (vLLM filters platform and general plugins by the same list).

- ``SPARKD_DRAIN_ADMIT=1`` when the launch drains (``[stop] drain_s`` above 0): the plugin's engine core takes in,
  as its drain begins, the requests vLLM accepted before the SIGTERM, which vLLM 0.32 would drop
  (:mod:`sparkd.vllm_probe.sparkd_vllm_probe.admit`).

Both edits are shell lines of the launch script (``export PYTHONPATH=...${PYTHONPATH:+:$PYTHONPATH}``), because only
the script sees the environment the image and the container give vLLM. vLLM loads general plugins in its engine core
since 0.9.0 (vllm#18326); :func:`too_old` says so for an older one, which runs as before without the probe.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from sparkd.config import Config
from sparkd.vllm_probe import PLUGIN_DIR
from sparkd.vllm_probe.sparkd_vllm_probe.admit import ADMIT_ENV
from sparkd.vllm_probe.sparkd_vllm_probe.layout import DIR_ENV, ENTRY_POINT

__all__ = ["ADMIT_ENV", "DIR_ENV", "ENTRY_POINT", "MIN_VLLM", "EnvEdit", "parse_version", "probe_dir", "probe_edits",
           "too_old", "version_of_tag"]

MIN_VLLM = (0, 9, 0)


@dataclass(frozen=True)
class EnvEdit:
    """A variable the launch script changes with regard to what the environment already holds: ``prepend`` a path
    (``value:$NAME``, or ``value`` alone), or ``append`` to a comma list only when it is set."""

    name: str
    value: str
    how: str  # "prepend" or "append"

    def shell(self) -> str:
        name, value = self.name, shlex.quote(self.value)
        if self.how == "prepend":
            return f'export {name}={value}"${{{name}:+:${name}}}"'
        return f'if [ -n "${{{name}+set}}" ]; then export {name}="${name},"{value}; fi'

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "value": self.value, "how": self.how}


def probe_dir(cfg: Config) -> Path | None:
    """Where the ranks write their step files; None when the probe is off."""
    return cfg.paths.run_dir / "probe" if cfg.health.step_probe else None


def probe_edits() -> tuple[EnvEdit, ...]:
    return (EnvEdit("PYTHONPATH", str(PLUGIN_DIR), "prepend"), EnvEdit("VLLM_PLUGINS", ENTRY_POINT, "append"))


_TAG = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")


def version_of_tag(image: str | None) -> tuple[int, int, int] | None:
    """vLLM's version from the tag of one of vLLM's own images (``vllm/vllm-openai:v0.8.5``); None for any other
    image (an NGC ``nvcr.io/nvidia/vllm:25.09-py3`` is numbered by its release, not vLLM's)."""
    if not image or "/vllm-openai:" not in f"/{image}":
        return None
    m = _TAG.match(image.rsplit(":", 1)[1])
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def parse_version(text: str) -> tuple[int, int, int] | None:
    """``0.32.0`` (or ``v0.8.5.post1``) as a triple; None for anything else."""
    m = _TAG.match(text.strip())
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def too_old(version: tuple[int, int, int], where: str) -> str | None:
    """Why vLLM ``version`` (found ``where``) cannot load the probe; None when it can."""
    if version >= MIN_VLLM:
        return None
    shown = ".".join(map(str, version))
    return (f"vLLM {shown} ({where}) is too old for the step probe: vLLM loads general plugins in its engine core "
            f"since {'.'.join(map(str, MIN_VLLM))}; this vLLM runs and is supervised as without the probe (set "
            "health.step_probe = false to launch it without)")
