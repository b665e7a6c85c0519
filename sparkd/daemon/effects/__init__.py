"""The lifecycle's actions carried out: ``node.Node`` is the loop's ``Effects`` port; each action goes to the part
that owns it (``launching``, ``preflighting``, ``stopping``, ``nodeevidence``) and its outcome is posted back as an
observation."""
