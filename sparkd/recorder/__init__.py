"""The flight recorder (issue 29): what each node looked like, second by second, where a power cut cannot take it.

- :mod:`.record`: one record and its compact binary form (pure).
- :mod:`.ring`: the fixed-size ring file: frames with a length, a sequence number and a CRC; the scan that
  recovers every complete record from whatever a power cut, a truncation or corruption left; the writer.
- :mod:`.writer`: the writer thread: appends off the event loop, ``fdatasync`` at a bounded rate.
- :mod:`.excerpt`, :mod:`.timeline`, :mod:`.rules`, :mod:`.postmortem`: the runs in a ring, the nodes on one
  clock, what most likely happened (pure functions over records) and the sentence that says it.
- :mod:`.baseline`: the memory settle before a start and the restart gate ("reboot needed"), pure.
- :mod:`.watchdog`: the optional hardware watchdog. :mod:`.bundle`: ``sparkctl bundle``.
"""
