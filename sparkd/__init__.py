"""sparkd: a per-node supervisor for vLLM on DGX Spark pairs."""

__version__ = "0.1.0"
