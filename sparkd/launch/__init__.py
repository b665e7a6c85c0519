"""The launch: the config rendered into vLLM's argv, environment and script (:mod:`.render`), pure.

Beside it what reads or judges a launch: the user's launch script (:mod:`.script`), the rehearsal with the stand-in
(:mod:`.rehearsal`), the secrets kept out of what sparkd shows (:mod:`.redact`), the config's lint
(:mod:`.lint`), a reload's diff (:mod:`.diff`) and the GPUs a launch uses (:mod:`.devices`). Lint and diff judge
the rendered launch, so they live here, above the config.
"""
