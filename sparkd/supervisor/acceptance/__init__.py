"""The acceptance gate's decisions (issue 37), pure: a start is ready when its answers and its capacity are what they
were, not when ``/health`` says 200.

- :mod:`.answers`: an answer, the identity a golden was recorded under, the golden itself (data and JSON shape);
- :mod:`.fingerprint`: the comparison of a start's answers with the golden (exact under the same identity, close
  agreement after a change);
- :mod:`.garble`: the checks on one answer (empty, cut short, a loop, broken characters, a foreign script, leaked
  special tokens);
- :mod:`.capacity`: the KV cache and the maximum concurrency against the expected band and the golden's;
- :mod:`.counters`: speculative decoding and numerics over two ``/metrics`` scrapes;
- :mod:`.gate`: the parts composed into one verdict with its sentence, timing and progress.

The I/O that asks the prompts and scrapes the counters is :mod:`sparkd.acceptance`; the golden's file is
:mod:`sparkd.state.golden`.
"""
