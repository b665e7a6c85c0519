"""vLLM 0.32's ``Initializing a V1 LLM engine`` line, as the CPU build the real-vLLM tier runs writes it: the fields
after the settings the stand-in takes from its arguments are the real line's (tests/data/vllm-logs/realvllm-032-*)."""

from __future__ import annotations

from typing import Any

AUX = (
    ', aux_output_config=AuxOutputConfig(enable_return_routed_experts=False, max_bytes=None)'
)
OBSERVABILITY = (
    ", structured_outputs_config=StructuredOutputsConfig(backend='auto', disable_any_whitespace=False, di"
    "sable_additional_properties=False, reasoning_parser='', reasoning_parser_plugin='', enable_in_reason"
    'ing=False), observability_config=ObservabilityConfig(show_hidden_metrics_for_version=None, otlp_trac'
    "es_endpoint=None, collect_detailed_traces=None, per_request_spec_decode_metrics='none', kv_cache_met"
    'rics=False, kv_cache_metrics_sample=0.01, custom_histogram_buckets=None, cudagraph_metrics=False, en'
    'able_layerwise_nvtx_tracing=False, enable_mfu_metrics=False, enable_mm_processor_stats=False, enable'
    "_logging_iteration_details=False, jit_monitor_mode='warn', jit_monitor_verbose=False)"
)
TAIL = (
    ", pooler_config=None, compilation_config={'mode': <CompilationMode.DYNAMO_TRACE_ONCE: 2>, 'debug_dum"
    "p_path': None, 'cache_dir': '', 'compile_cache_save_format': 'binary', 'backend': 'inductor', 'custo"
    "m_ops': ['none'], 'ir_enable_torch_wrap': False, 'splitting_ops': [], 'compile_mm_encoder': False, '"
    "cudagraph_mm_encoder': False, 'encoder_cudagraph_token_budgets': [], 'encoder_cudagraph_max_vision_i"
    "tems_per_batch': 0, 'encoder_cudagraph_max_frames_per_batch': None, 'cudagraph_decoder_replay': True"
    ", 'decoder_replay_cudagraph_capture_sizes': [], 'decoder_replay_trim_threshold': 768, 'compile_sizes"
    "': None, 'compile_ranges_endpoints': [2048], 'inductor_compile_config': {'enable_auto_functionalized"
    "_v2': False, 'dce': True, 'size_asserts': False, 'nan_asserts': False, 'epilogue_fusion': True, 'cpp"
    ".dynamic_threads': True}, 'inductor_passes': {}, 'cudagraph_mode': <CUDAGraphMode.NONE: 0>, 'cudagra"
    "ph_num_of_warmups': 0, 'cudagraph_capture_sizes': [], 'cudagraph_copy_inputs': False, 'cudagraph_spe"
    "cialize_lora': True, 'use_inductor_graph_partition': False, 'pass_config': {'fuse_norm_quant': False"
    ", 'fuse_act_quant': False, 'fuse_attn_quant': False, 'fuse_allreduce_rms': False, 'enable_qk_norm_ro"
    "pe_fusion': False, 'fuse_rope_kvcache_cat_mla': False, 'fuse_act_padding': False, 'fuse_qk_norm_rope"
    "_kvcache': False}, 'max_cudagraph_capture_size': None, 'dynamic_shapes_config': {'type': <DynamicSha"
    "pesType.BACKED: 'backed'>, 'evaluate_guards': False, 'assume_32_bit_indexing': False}, 'local_cache_"
    "dir': None, 'fast_moe_cold_start': False, 'static_all_moe_layers': []}, kernel_config=KernelConfig(i"
    "r_op_priority=IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sp"
    "arse=['native']), enable_flashinfer_autotune=True, enable_rocm_segmented_attn_autotune=False, enable"
    "_cutedsl_warmup=True, enable_jit_warmup=True, moe_backend='auto', sparse_indexer_topk_backend='auto'"
    ", linear_backend='auto', linear_backend_per_quant=None)"
)


def config_line(version: str, cfg: Any) -> str:
    return (
        f"Initializing a V1 LLM engine (v{version}) with config: model='{cfg.model}', "
        f"speculative_config={cfg.speculative_config}, tokenizer='{cfg.tokenizer or cfg.model}', "
        f"skip_tokenizer_init=False, tokenizer_mode={cfg.tokenizer_mode}, revision=None, "
        f"tokenizer_revision=None, trust_remote_code={cfg.trust_remote_code}, dtype=torch.bfloat16, "
        f"max_seq_len={cfg.resolved_max_model_len}, download_dir=None, load_format={cfg.load_format}, "
        f"tensor_parallel_size={cfg.tensor_parallel_size}, pipeline_parallel_size={cfg.pipeline_parallel_size}, "
        f"data_parallel_size=1, decode_context_parallel_size=1, dcp_comm_backend=ag_rs, "
        f"disable_custom_all_reduce=True, quantization={cfg.quantization}, quantization_config=None, "
        f"enforce_eager={cfg.enforce_eager}{AUX}, kv_cache_dtype={cfg.kv_cache_dtype}, "
        f"device_config=cpu{OBSERVABILITY}, "
        f"seed={cfg.seed}, served_model_name={cfg.served_model_names[0]}, "
        f"enable_prefix_caching={cfg.enable_prefix_caching}, "
        f"enable_chunked_prefill={cfg.enable_chunked_prefill}{TAIL}"
    )
