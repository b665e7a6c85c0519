"""The directory sparkd mounts read-only into vLLM's container and puts on its ``PYTHONPATH``: the
``sparkd-vllm-probe`` general plugin (``sparkd_vllm_probe/``) and its entry-point metadata
(``sparkd_vllm_probe-1.dist-info/``), which vLLM finds through ``importlib.metadata``. sparkd itself imports only
the record format from here (:mod:`sparkd.vllm_probe.sparkd_vllm_probe.layout`): one definition for the writer in
vLLM and the reader in sparkd."""

from __future__ import annotations

from pathlib import Path

PLUGIN_DIR = Path(__file__).resolve().parent
