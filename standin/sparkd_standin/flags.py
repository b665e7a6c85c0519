"""The ``vllm serve`` flags of each release the stand-in imitates, and the kind of value each takes.

The names were read from each release's source (``engine/arg_utils.py``, ``entrypoints/openai/cli_args.py`` and
its ``FrontendArgs`` fields) and checked against it: a flag the release does not have is an unrecognized
argument, as in vLLM (``--disable-log-requests`` and ``--swap-space`` are gone by 0.21, ``--jit-monitor-verbose``
arrives in 0.24). ``ACCEPTED`` maps each release (``0.13``, ``0.21``, ``0.24``) to the option strings it takes;
``make test-vllm`` holds ``ACCEPTED["0.24"]`` against the real 0.24 parser.

Kinds: ``str``/``int``/``float``/``hint`` (a human-readable int such as ``1M``/``200k``) take one value, ``json``
a JSON object (a dotted ``--flag.key value`` is merged in), ``list`` one or more values, ``bool`` is argparse's
BooleanOptionalAction (``--x`` / ``--no-x``), ``true`` is store_true. In a block, ``--long/-s`` are one flag's
names. Defaults are None unless the stand-in needs the value; vLLM's own defaults are applied in
``args.ServeConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

FAMILIES = ("0.13", "0.21", "0.24", "0.32")
# 0.32 takes 0.24's flags but these four, which its parser no longer has (the real 0.32 of the test tier, read with
# tests/vllm/batch_parse.py options; the tier holds ACCEPTED["0.32"] against that parser). Its new flags are not
# imitated: the stand-in refuses them as 0.24 would.
REMOVED_IN_032 = frozenset({"--calculate-kv-scales", "--max-long-partial-prefills", "--max-num-partial-prefills",
                            "--override-attention-dtype"})


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]
    kind: str
    default: object = None


# (the releases that accept them) -> kind -> flags
_BLOCKS: dict[tuple[str, ...], dict[str, str]] = {
    ('0.13', '0.21', '0.24'): {
        "str": """
            --all2all-backend --allowed-local-media-path --attention-backend --chat-template
            --chat-template-content-format --code-revision --config --config-format --convert
            --data-parallel-address/-dpa --data-parallel-backend/-dpb --distributed-executor-backend --download-dir
            --dtype --expert-placement-strategy --generation-config --hf-config-path --hf-token --host
            --io-processor-plugin --kv-cache-dtype --kv-offloading-backend --load-format --log-config-file
            --logprobs-mode --lora-dtype --mamba-cache-dtype --mamba-ssm-cache-dtype --master-addr
            --mm-encoder-attn-backend --mm-encoder-tp-mode --mm-processor-cache-type --model --model-impl
            --optimization-level --otlp-traces-endpoint --override-attention-dtype --prefix-caching-hash-algo
            --pt-load-map-location --quantization/-q --reasoning-parser --reasoning-parser-plugin --response-role
            --revision --root-path --runner --safetensors-load-strategy --scheduler-cls --scheduling-policy
            --show-hidden-metrics-for-version --ssl-ca-certs --ssl-certfile --ssl-keyfile --tokenizer
            --tokenizer-mode --tokenizer-revision --tool-call-parser --tool-parser-plugin --tool-server --uds
            --uvicorn-log-level --worker-cls --worker-extension-cls
        """,
        "int": """
            --api-server-count/-asc --block-size --cp-kv-cache-interleave-size --data-parallel-rank/-dpn
            --data-parallel-rpc-port/-dpp --data-parallel-size/-dp --data-parallel-size-local/-dpl
            --data-parallel-start-rank/-dpr --dbo-decode-token-threshold --dbo-prefill-token-threshold
            --dcp-kv-cache-interleave-size --decode-context-parallel-size/-dcp --h11-max-header-count
            --h11-max-incomplete-event-size --long-prefill-token-threshold --mamba-block-size --master-port
            --max-cpu-loras --max-cudagraph-capture-size --max-log-len --max-logprobs --max-long-partial-prefills
            --max-lora-rank --max-loras --max-num-partial-prefills --max-num-seqs --max-parallel-loading-workers
            --mm-shm-cache-max-object-size-mb --nnodes/-n --node-rank/-r --num-gpu-blocks-override
            --pipeline-parallel-size/-pp --port --prefill-context-parallel-size/-pcp --seed --ssl-cert-reqs
            --stream-interval --tensor-parallel-size/-tp
        """,
        "hint": """
            --kv-cache-memory-bytes --max-model-len --max-num-batched-tokens
        """,
        "float": """
            --cpu-offload-gb --gpu-memory-utilization --kv-cache-metrics-sample --kv-offloading-size
            --mm-processor-cache-gb --video-pruning-rate
        """,
        "json": """
            --additional-config --allowed-headers --allowed-methods --allowed-origins --attention-config/-ac
            --compilation-config/-cc --default-mm-loras --ec-transfer-config --eplb-config --hf-overrides
            --kv-events-config --kv-transfer-config --limit-mm-per-prompt --media-io-kwargs --mm-processor-kwargs
            --model-loader-extra-config --override-generation-config --pooler-config --profiler-config
            --structured-outputs-config
        """,
        "list": """
            --allowed-media-domains --api-key --collect-detailed-traces --cudagraph-capture-sizes --ignore-patterns
            --logits-processors --lora-modules --middleware --served-model-name
        """,
        "bool": """
            --allow-credentials --async-scheduling --calculate-kv-scales --cudagraph-metrics
            --data-parallel-external-lb/-dpe --data-parallel-hybrid-lb/-dph --disable-cascade-attn
            --disable-chunked-mm-input --disable-custom-all-reduce --disable-fastapi-docs
            --disable-hybrid-kv-cache-manager --disable-nccl-for-dp-synchronization --disable-sliding-window
            --disable-uvicorn-access-log --enable-auto-tool-choice --enable-chunked-prefill --enable-dbo
            --enable-eplb --enable-force-include-usage --enable-layerwise-nvtx-tracing --enable-log-outputs
            --enable-log-requests --enable-lora --enable-mm-embeds --enable-prefix-caching --enable-prompt-embeds
            --enable-prompt-tokens-details --enable-request-id-headers --enable-server-load-tracking
            --enable-sleep-mode --enable-ssl-refresh --enable-tokenizer-info-endpoint --enforce-eager
            --exclude-tools-when-tool-choice-none --fully-sharded-loras --interleave-mm-strings --kv-cache-metrics
            --kv-sharing-fast-prefill --log-error-stack --ray-workers-use-nsight --return-tokens-as-token-ids
            --skip-mm-profiling --skip-tokenizer-init --tokens-only --trust-remote-code
            --trust-request-chat-template --use-tqdm-on-load
        """,
        "true": """
            --aggregate-engine-logging --disable-log-stats --headless
        """,
    },
    ('0.21', '0.24'): {
        "str": """
            --dcp-comm-backend --disable-access-log-for-endpoints --fingerprint-mode --fingerprint-value
            --gdn-prefill-backend --mamba-backend --mamba-cache-mode --mm-encoder-attn-dtype
            --mm-encoder-fp8-scale-path --mm-encoder-fp8-scale-save-path --mm-tensor-ipc --moe-backend
            --offload-backend --performance-mode --ssl-ciphers
        """,
        "int": """
            --distributed-timeout-seconds --mamba-cache-philox-rounds --offload-group-size --offload-num-in-group
            --offload-prefetch-step --renderer-num-workers --safetensors-prefetch-block-size
            --safetensors-prefetch-num-threads --shutdown-timeout --ubatch-size
        """,
        "float": """
            --mm-encoder-fp8-scale-save-margin
        """,
        "json": """
            --default-chat-template-kwargs --ir-op-priority --kernel-config --reasoning-config
            --speculative-config/-sc --weight-transfer-config
        """,
        "list": """
            --cpu-offload-params --kv-cache-dtype-skip-layers --lora-target-modules --numa-bind-cpus
            --numa-bind-nodes --offload-params
        """,
        "bool": """
            --allow-deprecated-quantization --enable-elastic-ep --enable-ep-weight-filter
            --enable-expert-parallel/-ep --enable-flash-late-interaction --enable-flashinfer-autotune
            --enable-log-deltas --enable-logging-iteration-details --enable-mamba-cache-stochastic-rounding
            --enable-mfu-metrics --enable-offline-docs --enable-return-routed-experts --enable-tower-connector-lora
            --fail-on-environ-validation --language-model-only --mm-encoder-only --numa-bind
            --scheduler-reserve-full-isl --specialize-active-lora
        """,
        "true": """
            --grpc
        """,
    },
    ('0.24',): {
        "str": """
            --linear-backend --spec-method --spec-model
        """,
        "int": """
            --cpu-distributed-timeout-seconds --data-parallel-supervisor-port
            --dp-supervisor-probe-failure-threshold --prefill-schedule-interval --spec-tokens
        """,
        "float": """
            --dp-supervisor-probe-interval-s --dp-supervisor-probe-timeout-s --watermark
        """,
        "json": """
            --diffusion-config/-dc --quantization-config
        """,
        "list": """
            --device-ids
        """,
        "bool": """
            --enable-cumem-allocator --enable-mixed-moe-lora-format --jit-monitor-verbose --use-fp64-gumbel
        """,
        "true": """
            --data-parallel-multi-port-external-lb/-dpm
        """,
    },
    ('0.13',): {
        "str": """
            --logits-processor-pattern
        """,
        "float": """
            --swap-space
        """,
        "json": """
            --speculative-config
        """,
        "bool": """
            --disable-frontend-multiprocessing --disable-log-requests --enable-expert-parallel
        """,
    },
}
_DEFAULTS: dict[str, object] = {"--port": 8000, "--master-addr": "127.0.0.1", "--master-port": 29501}


@cache
def serve_flags(family: str) -> tuple[Flag, ...]:
    """The flags ``vllm serve`` of release ``family`` accepts."""
    if family == "0.32":
        return tuple(flag for flag in serve_flags("0.24") if not set(flag.names) & REMOVED_IN_032)
    flags = []
    for releases, kinds in _BLOCKS.items():
        if family not in releases:
            continue
        for kind, block in kinds.items():
            for spec in block.split():
                names = tuple(spec.split("/"))
                flags.append(Flag(names, kind, _DEFAULTS.get(names[0])))
    return tuple(flags)


ACCEPTED: dict[str, frozenset[str]] = {
    family: frozenset(name for flag in serve_flags(family) for name in flag.names) for family in FAMILIES
}
