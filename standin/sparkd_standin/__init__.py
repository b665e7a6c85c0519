"""The vLLM stand-in: a process that looks and fails like ``vllm serve`` 0.13 without a GPU.

Used by tests, the demo and rehearsals (a real config run with the stand-in in place of vLLM: same argv, same
environment). Behaviour follows ``reference/vllm-runtime-surface.md``. Faults are switched on with
``SPARKD_STANDIN_*`` variables or ``--standin-*`` flags (see ``knobs``).

Head node::

    APIServer (argv title)  ── spawn ──>  VLLM::EngineCore  ── spawn ──>  VLLM::Worker_TP0 ...
      server.py, api.py                    engine.py, executor.py          worker.py, rendezvous.py

Headless node (``--headless``)::

    main (argv title, headless.py)  ── spawn ──>  VLLM::Worker_TP1  <── master port ──>  head's Worker_TP0

Modules: args/flags (argv), knobs (faults), logfmt (vLLM log lines), sizing (fake GPU numbers), modelconfig
(max-model-len check), shm (psm_*),
procs (children), rendezvous (TCPStore), worker, executor, engine, client (API ↔ engine), metrics, generate
(OpenAI requests), api (HTTP app), faults (after-ready faults), server (head), headless.
"""
__version__ = "0.1.0"
