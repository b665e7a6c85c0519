"""The senses: what the daemon learns of vLLM and its host, posted as observations, never decided here. One
instance's exit, log lines and HTTP health (``instance``, its health signals in ``signals``), the GPUs (``gpus``),
the host's memory between the guard's samples (``memory``)."""
