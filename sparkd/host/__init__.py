"""What sparkd meets of its host, outside the runtimes: time (:mod:`.clock`), the exit statuses systemd reads
(:mod:`.exits`), systemd's notify socket (:mod:`.notify`) and journal (:mod:`.journal`), sparkd's logs
(:mod:`.logs`), files written safely (:mod:`.safefile`) under paths only trusted users may change
(:mod:`.trustedpaths`), plain HTTP clients (:mod:`.plainhttp`, :mod:`.keepalive`), times as printed
(:mod:`.timefmt`) and the node's GPUs (:mod:`.gpu`)."""
