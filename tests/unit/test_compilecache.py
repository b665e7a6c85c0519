"""Where vLLM's compile caches live where it runs, and whether they outlive the container (issue 36): docker-run binds
``[container] compile_cache_dir`` where a new container's vLLM keeps them, unless a configured mount holds that place;
lint warns where a recreate would lose them."""

from __future__ import annotations

from typing import Any

from sparkd.config import config_from_mapping
from sparkd.launch.compilecache import cache_mounts, compile_cache_dirs, unpersisted_caches
from sparkd.launch.lint import lint


def cfg(runtime: str = "docker-run", **container: Any) -> Any:
    return config_from_mapping({"runtime": runtime, "launch": {"model": "m"},
                                "container": {"image": "i", **container}}, env={})


def test_docker_run_binds_the_host_cache_where_vllm_keeps_it() -> None:
    assert cache_mounts(cfg(), {}) == [("/var/cache/sparkd/vllm", "/root/.cache/vllm"),
                                       ("/var/cache/sparkd/flashinfer", "/root/.cache/flashinfer")]
    moved = cfg(compile_cache_dir="/srv/cc")
    assert cache_mounts(moved, {"VLLM_CACHE_ROOT": "/cache/vllm"})[0] == ("/srv/cc/vllm", "/cache/vllm")
    assert unpersisted_caches(cfg(), {}) == {}


def test_a_configured_mount_or_false_or_another_runtime_binds_nothing() -> None:
    mounted = cfg(mounts=[{"source": "/c", "target": "/root/.cache"}])
    assert cache_mounts(mounted, {}) == [] and unpersisted_caches(mounted, {}) == {}
    off = cfg(compile_cache_dir=False)
    assert cache_mounts(off, {}) == [] and set(unpersisted_caches(off, {})) == {"vLLM's compile cache",
                                                                                  "FlashInfer's JIT cache"}
    exec_ = cfg("docker-exec")
    assert cache_mounts(exec_, {}) == [], "docker-exec's long-lived container is never recreated by a launch"
    assert "compile-cache-not-persisted" in {f.rule for f in lint(exec_)}
    assert compile_cache_dirs(cfg(user="1000"), {}) == {}, "another user's home is not known"


def test_a_relative_cache_dir_is_refused_naming_the_key() -> None:
    from sparkd.config import ConfigError

    try:
        cfg(compile_cache_dir="cache")
    except ConfigError as exc:
        assert any(p.startswith("container.compile_cache_dir:") for p in exc.problems), exc.problems
    else:
        raise AssertionError("a relative host path was accepted")
