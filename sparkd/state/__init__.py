"""What survives a restart of sparkd: its state files (:mod:`.files`, shapes in :mod:`.schema`), the node's lock
(:mod:`.lock`), the incident folders (:mod:`.incidents`) and the host's registry of sparkd instances
(:mod:`.instances`)."""
