"""The field's known traps as lint rules (issue 40): settings that cost users days, each rule naming the report that
taught it. Pure: the launch's words and environment, and what this node measured (:class:`NodeFacts`).

============================================  =======  ==============================================================
rule                                          level    the trap, and the report
============================================  =======  ==============================================================
``kv-offload-expandable-segments``            error    KV-cache offload with ``expandable_segments`` named in
                                                       ``PYTORCH_CUDA_ALLOC_CONF``: vLLM refuses ``:True`` with a KV
                                                       connector, and the workaround ``:False`` leaked on GB10 until
                                                       both hosts wedged, six times (MiaAI GLM PR #58); a warning for
                                                       the offload alone, which runs on the allocator's default
``engine-ready-timeout-below-cold-start``     error    ``VLLM_ENGINE_READY_TIMEOUT_S`` shorter than a start this node
                                                       measured: the next cold start dies at the timeout (vllm #48031:
                                                       a cold FlashInfer JIT on GB10 outlasts the 600 s default); a
                                                       warning under 1.5 times it
``dev-mode-beyond-loopback``                  error    ``VLLM_SERVER_DEV_MODE`` on while vLLM's API listens beyond
                                                       loopback: ``/sleep``, ``/collective_rpc``, ``/reset_*`` to
                                                       anyone who reaches the port, unguarded by the API key
============================================  =======  ==============================================================

The fourth trap, ranks whose images carry different NCCL, vLLM or CUDA builds (vllm #42354, #52504), is judged by
the head across the group before a start (:func:`sparkd.cluster.shared.build_differences`, rule ``build-parity``).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from sparkd.config import Config
from sparkd.launch.render import EnvSetting

__all__ = ["RULES", "NodeFacts", "field_traps", "rules_markdown"]

READY_TIMEOUT_ENV = "VLLM_ENGINE_READY_TIMEOUT_S"
VLLM_READY_DEFAULT_S = 600.0  # vllm/envs.py
READY_MARGIN = 1.5
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
ALLOC_ENVS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")

# id → (level of the known-bad setting, the report that taught it): the config reference lists them.
RULES: dict[str, tuple[str, str]] = {
    "kv-offload-expandable-segments": (
        "error", "KV-cache offload on GB10 with expandable_segments: vLLM refuses :True with a KV connector, and "
        ":False leaked until both hosts wedged, six times for one user (MiaAI GLM PR #58)"),
    "engine-ready-timeout-below-cold-start": (
        "error", "VLLM_ENGINE_READY_TIMEOUT_S shorter than a start this node measured: a cold FlashInfer JIT on GB10 "
        "outlasts vLLM's 600 s default (vllm #48031)"),
    "dev-mode-beyond-loopback": (
        "error", "VLLM_SERVER_DEV_MODE=1 while vLLM's API listens beyond loopback: /sleep, /wake_up, "
        "/collective_rpc and /reset_* are open to the network, unguarded by the API key (vLLM's routers.py and "
        "authenticate.py; Aquila binds them to 127.0.0.1 behind its proxy)"),
    "build-parity": (
        "error", "the ranks' images carry different NCCL, vLLM or CUDA builds: the same NCCL version built twice "
        "hung a pair (vllm #42354), NCCL 2.28.9 against 2.30.4 broke CUDA graphs across nodes (vllm #52504)"),
}


def rules_markdown() -> str:
    """The config reference's section on these rules (``sparkd config-reference``, docs/config.md)."""
    rows = [f"| `{rule}` | {level} | {report} |" for rule, (level, report) in RULES.items()]
    return ("\n## Lint rules from the field\n\nSettings that cost users days, checked with the other lint rules by "
            "`sparkd check-config`, `sparkd run` and a reload, in the environment vLLM starts with (on the host "
            "sparkd's own included); an error refuses the config unless its id is in `[lint] allow`. "
            "`engine-ready-timeout-below-cold-start` judges by the starts this node measured (`start-times.json` and "
            "`status.json` in `[paths] state_dir`), in `sparkd check-config` and again in the preflight before every "
            "start; `build-parity` is the head's, before it starts the workers, on the builds each rank's preflight "
            "read (check `builds`).\n\n"
            "| Rule | Level | The trap, and the report that taught it |\n|---|---|---|\n" + "\n".join(rows) + "\n")


@dataclass(frozen=True)
class NodeFacts:
    """What this node measured that a rule may judge by (read from its state directory by the caller)."""

    # vLLM's starts as sparkd timed them: the engine's part, distributed init to the end of CUDA graph capture
    cold_starts_s: tuple[float, ...] = ()


def field_traps(cfg: Config, env: Mapping[str, EnvSetting], words: Sequence[str],
                node: NodeFacts | None = None) -> Iterator[tuple[str, str, str, str]]:
    """(rule, level, key, message) of every trap the launch falls into; ``words``: the serve command's flags."""
    yield from kv_offload_expandable_segments(env, words)
    yield from engine_ready_timeout(env, node or NodeFacts())
    yield from dev_mode_beyond_loopback(cfg, env)


def _flag_value(words: Sequence[str], flag: str) -> str | None:
    for i, word in enumerate(words):
        if word == flag and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def kv_offload(words: Sequence[str]) -> str | None:
    """How the launch offloads its KV cache (the flag as written), or None."""
    size = _flag_value(words, "--kv-offloading-size")
    if size is not None:
        return f"--kv-offloading-size {size}"
    transfer = _flag_value(words, "--kv-transfer-config")
    if transfer is not None:
        try:
            connector = str(json.loads(transfer).get("kv_connector") or "")
        except (ValueError, AttributeError):
            connector = transfer
        if "Offload" in connector or "LMCache" in connector:
            return f"--kv-transfer-config with {connector}"
    return None


def kv_offload_expandable_segments(env: Mapping[str, EnvSetting],
                                   words: Sequence[str]) -> Iterator[tuple[str, str, str, str]]:
    rule = "kv-offload-expandable-segments"
    offload = kv_offload(words)
    if offload is None:
        return
    said = next(((name, env[name]) for name in ALLOC_ENVS if name in env and "expandable_segments" in env[name].value),
                None)
    report = "MiaAI GLM PR #58"
    if said is None:
        yield (rule, "warning", "launch.extra_args",
               f"{offload} offloads the KV cache to host memory; on GB10 that is the same unified memory, and KV "
               f"offload ran on a non-expandable allocator that leaked until both hosts wedged, six times for one "
               f"user ({report}): on GB10 leave the offload out")
        return
    name, setting = said
    on = "expandable_segments:true" in setting.value.replace(" ", "").lower()
    why = (f"vLLM refuses a KV connector with {name}={setting.value} (a config error minutes into the start), and "
           "the workaround, expandable_segments:False, leaked on GB10 until both hosts wedged, six times for one user"
           if on else
           f"{name}={setting.value} is the setting KV offload forces on GB10, and it leaked until both hosts wedged, "
           "six times for one user")
    yield (rule, "error", setting.key, f"{offload} with {why} ({report}); on GB10 leave the KV offload out")


def engine_ready_timeout(env: Mapping[str, EnvSetting], node: NodeFacts) -> Iterator[tuple[str, str, str, str]]:
    rule = "engine-ready-timeout-below-cold-start"
    if not node.cold_starts_s:
        return
    longest = max(node.cold_starts_s)
    setting = env.get(READY_TIMEOUT_ENV)
    try:
        timeout = float(setting.value) if setting is not None else VLLM_READY_DEFAULT_S
    except ValueError:
        return  # not a number: vLLM's own parse fails it at once, and lint's recommended-env rule says so
    key = setting.key if setting is not None else f"launch.env.{READY_TIMEOUT_ENV}"
    value = f"{setting.value} s" if setting is not None else f"unset, so vLLM's default {VLLM_READY_DEFAULT_S:.0f} s"
    measured = (f"this node's longest measured start took {longest:.0f} s (of {len(node.cold_starts_s)} timed by "
                "sparkd: the engine's part, distributed init to the end of CUDA graph capture)")
    if timeout < longest:
        yield (rule, "error", key, f"{READY_TIMEOUT_ENV} is {value}, but {measured}: the next cold start dies "
               f"at the timeout (vllm #48031: a cold FlashInfer JIT on GB10 outlasts vLLM's 600 s default); set it "
               f"to at least {_rounded(longest * 2)}")
    elif timeout < longest * READY_MARGIN:
        yield (rule, "warning", key, f"{READY_TIMEOUT_ENV} is {value}, less than {READY_MARGIN:g} times what "
               f"{measured}: a colder cache (a new image, a cleared JIT cache) can outlast it (vllm #48031); "
               f"set it to at least {_rounded(longest * 2)}")


def _rounded(seconds: float) -> str:
    return f"{int(-(-seconds // 60) * 60)} s"


def _loopback(host: str | None) -> bool:
    if host is None:
        return False  # vLLM's default binds every address
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def dev_mode_beyond_loopback(cfg: Config, env: Mapping[str, EnvSetting]) -> Iterator[tuple[str, str, str, str]]:
    setting = env.get(DEV_MODE_ENV)
    if setting is None or cfg.headless:  # a headless rank serves no API
        return
    try:
        on = bool(int(setting.value))  # vLLM reads it so: bool(int(...))
    except ValueError:
        return
    host = cfg.launch.host
    if not on or _loopback(host):
        return
    where = f"on {host}" if host else "on every address (launch.host unset)"
    yield ("dev-mode-beyond-loopback", "error", setting.key,
           f"{DEV_MODE_ENV}={setting.value} opens vLLM's dev routes (/sleep, /wake_up, /collective_rpc, "
           f"/reset_prefix_cache, /server_info, /pause) and vLLM's API listens {where}: anyone who reaches the port "
           "may put the engine to sleep or run a method in every worker, and vLLM's API key guards only /v1 and "
           "/v2 (vLLM's routers.py and authenticate.py); set launch.host = \"127.0.0.1\" behind a proxy, as Aquila "
           f"does, or drop {DEV_MODE_ENV}")
