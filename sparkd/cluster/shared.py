"""Pure pair decisions: which launch settings must agree, whether the ranks run the same image, and what a
worker's status says about its rank.

Rules:

1. Every rank of one instance shares the model, the parallel layout (tensor, pipeline, expert), the speculative
   and compilation config, block size, batch limits, KV-cache dtype, max_model_len, eager mode, custom
   all-reduce, ``extra_args``, the rendezvous (master address and port, nnodes) and the environment variables
   named by ``[cluster] shared_env`` (fnmatch patterns; ``!`` excludes: node addresses differ by design). A
   secret among them (``VLLM_API_KEY``) is compared by its keyed digest (``sparkd.config.secretrule``).
2. The image is compared by ``[cluster] image_match``: ``id`` (the same local image id), ``repo-digest`` (a repo
   digest in common: pulled from one registry manifest), ``label`` (the same value of ``[cluster] image_label``:
   images built on each node from one revision, field report 004) or ``off``. What cannot be compared (a
   ``docker load``ed image has no repo digest, a build without the label) is a difference, named as such.
3. The builds the ranks run (``builds`` in each rank's image facts, read by the ``builds`` preflight check:
   ``sparkd.preflight.builds``) must agree on vLLM, torch, torch's CUDA, NCCL's version and NCCL's library itself
   (its sha256: the same version built twice hung a pair, vllm #42354; NCCL 2.28.9 against 2.30.4 broke CUDA graphs
   across nodes, vllm #52504). Only what both ranks know is compared; ``[lint] allow = ["build-parity"]`` accepts a
   difference deliberately.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

from sparkd.commands.statusdoc import Status
from sparkd.config import Config
from sparkd.config.secretrule import MASK, digest, is_secret_name
from sparkd.launch.render import render_env

RUNNING_STATES = ("starting", "accepting", "ready", "degraded")

_SHARED_LAUNCH = (
    "model", "tensor_parallel_size", "pipeline_parallel_size", "enable_expert_parallel", "speculative_config",
    "compilation_config", "block_size", "max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype",
    "max_model_len", "enforce_eager", "disable_custom_all_reduce", "extra_args",
)
def shared_env(env: Mapping[str, str], patterns: Sequence[str]) -> dict[str, str]:
    """The part of ``env`` the ranks must agree on (``patterns``: fnmatch, ``!`` excludes)."""
    include = [p for p in patterns if not p.startswith("!")]
    exclude = [p[1:] for p in patterns if p.startswith("!")]
    return {k: v for k, v in sorted(env.items())
            if any(fnmatchcase(k, p) for p in include) and not any(fnmatchcase(k, p) for p in exclude)}


def shared_settings(cfg: Config, key: str | None = None) -> dict[str, Any]:
    """Launch settings every rank of one instance must share. A secret is given as its digest under ``key`` (the
    peers' shared secret: equal on every rank exactly when the values are), never as itself; without a key, as
    ``(secret)``."""
    launch = cfg.launch
    settings: dict[str, Any] = {name: getattr(launch, name) for name in _SHARED_LAUNCH}
    settings.update({"master_addr": cfg.master_addr, "master_port": cfg.master_port, "nnodes": cfg.nnodes})
    env = {**(cfg.container.env if cfg.runtime.in_container else {}), **render_env(cfg)}
    for name, value in shared_env(env, cfg.cluster.shared_env).items():
        secret = is_secret_name(name, launch.secret_env)
        settings[f"env.{name}"] = (digest(value, key) if key else MASK) if secret else value
    return settings


def differences(local: dict[str, Any], remote: dict[str, Any], *, peer: str) -> list[str]:
    """One phrase per setting that differs, naming both values."""
    out = []
    for key in sorted(local.keys() | remote.keys()):
        if local.get(key) != remote.get(key):
            out.append(f"{key} is {local.get(key)!r} here but {remote.get(key)!r} on {peer}")
    return out


ImageFacts = Mapping[str, Any]  # ImageIdentity.to_json(): {"id", "repo_digests", "labels"}; a bare id is accepted


def _facts(image: ImageFacts | str | None) -> ImageFacts | None:
    return {"id": image} if isinstance(image, str) else image


def image_difference(local: ImageFacts | str | None, remote: ImageFacts | str | None, *, peer: str,
                     mode: str = "id", label: str = "org.opencontainers.image.revision") -> str | None:
    """Why the two ranks' images do not count as the same under ``mode``, or None. Nothing to compare (no image
    on either side, a process runtime) is no difference."""
    here, there = _facts(local), _facts(remote)
    if mode == "off" or not here or not there or not here.get("id") or not there.get("id"):
        return None
    if mode == "repo-digest":
        ours, theirs = set(here.get("repo_digests") or ()), set(there.get("repo_digests") or ())
        if not ours or not theirs:
            side = "here" if not ours else f"on {peer}"
            return (f"the image has no repo digest {side} (built or loaded locally), so cluster.image_match = "
                    "'repo-digest' cannot match it; pull it from a registry on both nodes or choose 'id' or 'label'")
        if not ours & theirs:
            return f"the image's repo digests differ: {sorted(ours)[0]} here but {sorted(theirs)[0]} on {peer}"
        return None
    if mode == "label":
        mine, yours = (here.get("labels") or {}).get(label), (there.get("labels") or {}).get(label)
        if mine is None or yours is None:
            side = "here" if mine is None else f"on {peer}"
            return f"the image has no label {label} {side} (cluster.image_match = 'label' compares it)"
        if mine != yours:
            return f"the image's label {label} is {mine!r} here but {yours!r} on {peer}"
        return None
    if here["id"] != there["id"]:
        return f"the image is {str(here['id'])[:19]} here but {str(there['id'])[:19]} on {peer}"
    return None


BUILD_FIELDS = (("vllm", "vLLM"), ("torch", "torch"), ("cuda", "torch's CUDA"), ("nccl", "NCCL"))


def builds_of(facts: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The builds a rank's image facts (or status) carry, or None."""
    if not facts:
        return None
    found = facts.get("builds") or (facts.get("image") or {}).get("builds")
    return found if isinstance(found, Mapping) else None


def build_differences(local: Mapping[str, Any] | None, remote: Mapping[str, Any] | None, *, peer: str) -> list[str]:
    """One phrase per build the two ranks run differently, naming both; nothing for what either does not know."""
    if not local or not remote:
        return []
    out = [f"{name} is {local[key]} here but {remote[key]} on {peer}" for key, name in BUILD_FIELDS
           if local.get(key) and remote.get(key) and local[key] != remote[key]]
    mine, theirs = local.get("nccl_sha256"), remote.get("nccl_sha256")
    if mine and theirs and mine != theirs:
        same = local.get("nccl") and local.get("nccl") == remote.get("nccl")
        what = f"the same NCCL version ({local['nccl']}) but another build" if same else "another NCCL library"
        out.append(f"{peer} runs {what}: libnccl sha256 {str(mine)[:12]} here, {str(theirs)[:12]} there")
    return out


def rank_waiting_or_later(status: Status) -> bool:
    """The worker's rank process is up and has reached torch.distributed init (or beyond)."""
    if status.get("state") not in RUNNING_STATES or not status.get("pid"):
        return False
    return status.get("phase") not in (None, "launching")


def rank_gone(status: Status) -> bool:
    """The worker reports no running rank (it failed, stopped, or never started)."""
    return status.get("state") not in (*RUNNING_STATES, "preflight", "adopting")


def head_ends_the_group(status: Status) -> bool:
    """The head's sparkd stops the group, or has stopped it: its rank ended on purpose (its order to stop the
    workers' ranks follows once its own is gone)."""
    return status.get("state") in ("stopping", "stopped")


def peer_base_url(peer: str, default_port: int, scheme: str = "http") -> str:
    """``host``, ``host:port``, ``[v6]:port`` or a bare IPv6 address → the peer's base URL."""
    if peer.startswith("["):
        host, _, rest = peer[1:].partition("]")
        return f"{scheme}://[{host}]:{rest.lstrip(':') or default_port}"
    if peer.count(":") == 1:
        host, port = peer.split(":")
        return f"{scheme}://{host}:{port}"
    if ":" in peer:
        return f"{scheme}://[{peer}]:{default_port}"
    return f"{scheme}://{peer}:{default_port}"
