"""What ``sparkd run`` does around the loop: the checks before anything is built (``startup``), the listening
sockets and the servers on them (``sockets``, ``serving``), the config's reload (``reload``) and the restart
breaker a config error opened (``breaker``)."""
