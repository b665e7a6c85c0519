"""The stand-in's vLLM 0.32 is the real one the test tier runs (issue 25 §7): every line sparkd reads from the stand-in
as 0.32 has the shape of a line the real vLLM 0.32 wrote (tests/data/vllm-logs/realvllm-032-*, the tier's own
recordings), and every such real line of a start, a request, an engine death and a stop has its stand-in twin; the
stand-in's /metrics page has the real page's families that sparkd reads, with the real labels
(tests/data/vllm-metrics-032.txt). So the stand-in cannot drift from the real vLLM again without a test failing.

A shape is a line with what changes between runs taken out: process ids, times, numbers, the model's path, temporary
names. The process name, the level, the ``[file.py:line]`` and every word stay.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import httpx
from freeport import free_port
from standin_helpers import Standin, Standins

from sparkd.daemon.watch.probes import read_metrics_page
from sparkd.supervisor.drainlog import is_drain_line
from sparkd.supervisor.logline import parse
from sparkd.supervisor.progress import is_progress
from sparkd.supervisor.rules import RULES
from sparkd.supervisor.servelog import read_serve_line

DATA = Path(__file__).resolve().parents[1] / "data"
REAL = [DATA / "vllm-logs" / f"realvllm-032-{name}.log" for name in
        ("ready-then-stopped", "engine-core-sigkill", "engine-core-sigstop-in-flight")]
REAL_METRICS = DATA / "vllm-metrics-032.txt"
MODEL = "/models/tinyllm"
# Real lines sparkd reads that the stand-in does not imitate, and why.
NOT_IMITATED = {
    "[backbone] saved AOT compiled function to PATH": "vLLM's compile cache on disk: the stand-in compiles nothing",
}
_PATH = re.compile(r"(?:/[\w.@+-]+)+/?")
_NUMBER = re.compile(r"\d[\d,.]*")


def shape(raw: str, model: str) -> str:
    line = parse(raw)
    message = line.message.replace(model, "MODEL")
    message = _PATH.sub("PATH", message)
    message = " ".join(_NUMBER.sub("N", message).split())  # tqdm and tables pad numbers to a width
    return f"{line.process or '-'} {line.level or '-'} {line.source or '-'} | {message}".replace(
        f"[{line.source}]", "")


def read_by_sparkd(raw: str) -> bool:
    text = parse(raw).text
    return is_progress(raw) or read_serve_line(raw) is not None or any(r.pattern.search(text) for r in RULES) or \
        is_drain_line(raw)


def real_shapes() -> set[str]:
    shapes = set()
    for path in REAL:
        text = path.read_text(encoding="utf-8")
        _, _, body = text.partition("\n---\n")
        model = re.search(r"model='([^']+)'", body)
        for raw in body.splitlines():
            if read_by_sparkd(raw):
                shapes.add(shape(raw, model.group(1) if model else MODEL))
    return shapes


def run_032(launch: Standins) -> tuple[Standin, int]:
    port = free_port()
    standin = launch.start(
        MODEL, "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512", "--dtype", "bfloat16",
        "--served-model-name", "tinyllm",
        env={"SPARKD_STANDIN_VLLM_VERSION": "0.32.0", "NO_COLOR": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
             "OMP_NUM_THREADS": "1", "VLLM_LOG_STATS_INTERVAL": "0.5"},
    )
    standin.wait_ready()
    return standin, port


def _complete(port: int) -> int:
    body = {"model": "tinyllm", "prompt": "hello", "max_tokens": 8}
    return httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=30).status_code


def test_every_line_sparkd_reads_from_the_standin_is_a_real_032_line(launch: Standins) -> None:
    standin, port = run_032(launch)
    assert _complete(port) == 200
    standin.wait_for(r"\[loggers\.py:\d+\] Engine 000: Avg prompt throughput", timeout=20)
    standin.send(signal.SIGTERM)
    standin.wait_exit()
    ours = {shape(raw, MODEL) for raw in standin.lines if read_by_sparkd(raw)}
    real = real_shapes()
    assert not ours - real, "the stand-in prints lines vLLM 0.32 does not:\n" + "\n".join(sorted(ours - real))
    wanted = {s for s in real if not any(key in s for key in NOT_IMITATED)}
    died = {s for s in wanted if "engine core exited unexpectedly" in s or "output_handler" in s
            or "EngineDeadError" in s or "Parent process exited" in s}
    missing = wanted - died - ours
    assert not missing, "real vLLM 0.32 lines the stand-in never prints:\n" + "\n".join(sorted(missing))


def test_an_engine_core_death_is_logged_as_032_logs_it(launch: Standins) -> None:
    standin, _ = run_032(launch)
    engine = next(p for p in standin.tree() if "EngineCore" in " ".join(p.cmdline()) or "EngineCore" in p.name())
    engine.kill()
    standin.wait_for(r"EngineDeadError", timeout=20)
    ours = {shape(raw, MODEL) for raw in standin.lines if read_by_sparkd(raw)}
    real = real_shapes()
    for needed in ("engine core exited unexpectedly", "AsyncLLM output_handler failed", "EngineDeadError"):
        line = next((s for s in ours if needed in s), None)
        assert line is not None and line in real, (needed, line)


def test_the_metrics_page_has_the_real_families_sparkd_reads(launch: Standins) -> None:
    _, port = run_032(launch)
    page = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    real_page = REAL_METRICS.read_text()

    def families(text: str) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for line in text.splitlines():
            m = re.match(r"^(vllm:\w+)(?:\{([^}]*)\})?\s", line)
            if m:
                out.setdefault(m.group(1), set()).update(re.findall(r"(\w+)=", m.group(2) or ""))
        return out

    ours, real = families(page), families(real_page)
    read = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total",
            "vllm:prompt_tokens_total", "vllm:kv_cache_usage_perc")
    for name in read:
        assert name in ours and name in real, name
        assert ours[name] == real[name], (name, ours[name], real[name])
    assert read_metrics_page(page) is not None and read_metrics_page(real_page) is not None
    assert not set(ours) - set(real), f"families the real 0.32 page does not have: {sorted(set(ours) - set(real))}"
