"""The daemon for one node: the imperative shell around the pure lifecycle (``sparkd.supervisor``), in wings.

- ``loop/``: the one owner — the supervisor's queue of observations, the lifecycle it steps, what it remembers.
- ``boot/``: what ``sparkd run`` does around the loop — the checks before anything, the sockets and servers, the
  config's reload, the breaker a config error opened.
- ``watch/``: the senses — one instance's exit, log lines and health probes, the GPUs, the host's memory; they
  only post observations.
- ``effects/``: the lifecycle's actions carried out (preflight, launch, stop, incidents) and posted back.
- ``views/``: what the daemon shows — status, the STATUS= line, /metrics, the flight recorder, the commands' port.
- ``app``: builds all of it from the config in one pass and runs it (``adapters``: the host as a test replaces it).
"""
