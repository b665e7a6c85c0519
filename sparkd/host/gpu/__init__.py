"""The GPUs of this node as NVML sees them (``nvidia-smi`` the fallback and the evidence format).

- :mod:`sparkd.host.gpu.model`: what one reading holds (devices, their memory, compute processes, power, clocks).
  Pure data, JSON both ways.
- :mod:`sparkd.host.gpu.nvml`: the reading through NVML (``nvidia-ml-py``), every field that the device does not
  expose left out, never an error; no library or driver: a reading that says why it was skipped.
- :mod:`sparkd.host.gpu.smi`: ``nvidia-smi``'s CSV queries (the fallback) and ``nvidia-smi -q`` (incidents).
- :mod:`sparkd.host.gpu.fake`: an NVML stand-in for tests, fed with real readings (tests/data/gpu/).
- :mod:`sparkd.host.gpu.reading`: one reading for whoever asks, and the launch's devices among it (which GPUs a
  launch uses is :mod:`sparkd.launch.devices`' decision).
- :mod:`sparkd.host.gpu.memcheck`: vLLM's free-memory rule per device, and what the host itself needs. Pure.
- :mod:`sparkd.host.gpu.release`: after a stop, until when the stopped processes' GPU memory is back. Pure decision.
- :mod:`sparkd.host.gpu.power`: "power fell while requests run", from a history of readings. Pure.

On unified-memory devices (GB10) NVML answers "not supported" for device memory: the reading marks the device
``unified`` and every user keeps the host's MemAvailable reasoning for it.
"""
