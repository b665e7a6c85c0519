"""The vLLM stand-in: a process that looks and fails like ``vllm serve`` 0.13, 0.21 or 0.24 without a GPU.

The ``sparkd-standin`` distribution, apart from sparkd: sparkd's tests, its demo and ``sparkd run --rehearse`` (a
real config run with the stand-in in place of vLLM: same argv, same environment) run it. Behaviour follows vLLM's
source for those releases (``dialect`` holds what differs) and ``reference/vllm-runtime-surface.md``. Faults are
switched on with ``SPARKD_STANDIN_*`` variables or ``--standin-*`` flags (see ``knobs``).

Head node::

    APIServer (argv title)  ── spawn ──>  VLLM::EngineCore  ── spawn ──>  VLLM::Worker_TP0 ...
      server.py, api.py                    engine.py, executor.py          worker.py, loading.py, rendezvous.py

Headless node (``--headless``)::

    main (argv title, headless.py)  ── spawn ──>  VLLM::Worker_TP1  <── master port ──>  head's Worker_TP0

Modules: args/flags (argv, per release), knobs (faults), dialect (what differs between releases), logfmt (vLLM
log lines and prefixes), sizing (fake GPU numbers), modelconfig (max-model-len check), shm (psm_*), procs
(children), rendezvous (TCPStore), worker and loading (a rank), executor, engine, client (API ↔ engine),
metrics, generate (OpenAI requests), api (HTTP app), faults (after-ready faults), server (head), headless.
"""

__version__ = "0.1.0"
