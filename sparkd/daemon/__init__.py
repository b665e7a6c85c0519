"""The daemon for one node: the imperative shell around the pure lifecycle (``sparkd.supervisor``).

- ``supervisor``: the loop — one queue of observations, the lifecycle table decides, actions go to the node.
- ``node``: this node's vLLM — launch, stop, preflight, incidents (the lifecycle's effects), and its watch.
- ``watch``: one instance's exit, log lines and health probes, turned into observations.
- ``view``: what the daemon shows (status, the systemd STATUS line, history), read-only.
- ``control``: the operator surface the control API's commands use.
- ``app``: builds all of it from the config and runs it (servers, guard, group, signals, watchdog).
"""
