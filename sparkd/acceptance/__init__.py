"""The acceptance gate's I/O (issue 37): the client that asks vLLM the fixed prompts and reads its counters
(:mod:`.client`), what a golden was recorded under (:mod:`.identity`), and one run of the gate (:mod:`.runner`).
The decisions are the core's (:mod:`sparkd.supervisor.acceptance`); the golden's file is
:mod:`sparkd.state.golden`."""
