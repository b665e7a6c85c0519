"""Exit statuses of ``sparkd run`` (and the one-shot commands), as the systemd unit reads them.

The unit's ``RestartPreventExitStatus=`` lists every status that a restart cannot fix, so systemd stops at
once on a config or host problem instead of retrying it every few seconds forever.
"""

from __future__ import annotations

OK = 0
FAILURE = 1  # anything else: systemd restarts sparkd, which adopts the running vLLM
INVALID_CONFIG = 2  # the config does not load or lint; `sparkd check-config` says why
HOST_PROBLEM = 3  # the host refuses what sparkd needs: a port taken, a directory not writable, a bad address
ALREADY_RUNNING = 4  # another sparkd holds this node's lock

# What RestartPreventExitStatus= lists in systemd/sparkd.service (a test keeps the two in step).
NOT_RESTARTABLE = (INVALID_CONFIG, HOST_PROBLEM, ALREADY_RUNNING)
