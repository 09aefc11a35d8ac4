"""Every Serve config parses with Ray Serve's own schema and our typed args, and the GPU
configs produce the placement groups they promise (no cluster needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

pytest.importorskip("ray.serve.llm")

from ray.serve.schema import ServeDeploySchema  # noqa: E402

from deployments.app import llm_config, omp_bind  # noqa: E402
from deployments.config import TernaryServeConfig  # noqa: E402

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def _args(path: Path) -> dict:
    return yaml.safe_load(path.read_text())["applications"][0]["args"]


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_config_validates(path):
    schema = ServeDeploySchema.model_validate(yaml.safe_load(path.read_text()))
    assert schema.applications[0].import_path == "deployments.app:build_app"
    cfg = TernaryServeConfig.model_validate(_args(path))
    assert cfg.autoscaling.min_replicas <= cfg.autoscaling.max_replicas


@pytest.mark.parametrize("name,tp", [("tp1.yaml", 1), ("tp2.yaml", 2), ("tp4.yaml", 4)])
def test_gpu_placement_groups(name, tp):
    cfg = TernaryServeConfig.model_validate(_args(REPO / "configs" / name))
    assert cfg.device == "gpu" and cfg.tensor_parallel_size == tp
    llm = llm_config(cfg)
    assert llm.placement_group_config["strategy"] == "STRICT_PACK"
    assert llm.placement_group_config["bundles"] == [{"GPU": 1, "CPU": 1}] * tp
    assert llm.engine_kwargs["tensor_parallel_size"] == tp
    assert llm.runtime_env["env_vars"]["VLLM_PLUGINS"] == "ternary"
    assert "distributed_executor_backend" not in llm.engine_kwargs  # Ray workers inside the placement group
    assert llm.engine_kwargs.get("disable_custom_all_reduce", False) == (tp > 1)


def test_unknown_and_out_of_range_keys_are_refused():
    base = _args(REPO / "configs" / "cpu.yaml")
    with pytest.raises(ValueError, match="max_replica_count"):
        TernaryServeConfig.model_validate({**base, "max_replica_count": 3})
    with pytest.raises(ValueError, match=r"min_replicas \(3\) > max_replicas \(1\)"):
        TernaryServeConfig.model_validate({**base, "autoscaling": {"min_replicas": 3, "max_replicas": 1}})
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        TernaryServeConfig.model_validate({**base, "tensor_parallel_size": 0})
    with pytest.raises(ValueError, match=r"ingress_deployment_config: unknown or fixed option\(s\) \['replicas'\]"):
        TernaryServeConfig.model_validate({**base, "ingress_deployment_config": {"replicas": 2}})
    with pytest.raises(ValueError, match=r"ingress_deployment_config: .*max_replicas \(1\) must be greater"):
        TernaryServeConfig.model_validate(
            {**base, "ingress_deployment_config": {"autoscaling_config": {"min_replicas": 2, "max_replicas": 1}}})
    with pytest.raises(ValueError, match="ingress_deployment_config: .*num_replicas is not allowed"):
        TernaryServeConfig.model_validate(
            {**base, "ingress_deployment_config": {"num_replicas": 2, "autoscaling_config": {"max_replicas": 3}}})
    with pytest.raises(ValueError, match="max_queued_requests 4 is refused: Serve's proxy answers .* plain text"):
        TernaryServeConfig.model_validate({**base, "ingress_deployment_config": {"max_queued_requests": 4}})
    with pytest.raises(ValueError, match="has no config.json; convert a model first"):
        TernaryServeConfig.model_validate({**base, "model": "models/does-not-exist"}).check_model_dir()


def test_omp_bind_splits_cores_over_ranks():
    assert omp_bind(1, 2) == "0-1"
    assert omp_bind(2, 2) == "0|1"
    assert omp_bind(4, 2) == "0|1|0|1"
    assert omp_bind(2, 8) == "0-3|4-7"


def test_serve_llm_import_failure_names_the_version_pair(monkeypatch):
    """Seen on the H200: Ray 2.60's Serve LLM with vLLM 0.25.1 fails inside Ray with a bare
    ModuleNotFoundError; build_app says which pair is installed and what would match."""
    import builtins

    from deployments import app

    real_import = builtins.__import__

    def failing_import(name, *args, **kwargs):
        if name.startswith("ray.llm._internal.serve.core.configs"):
            raise ModuleNotFoundError("No module named 'vllm.entrypoints.serve.engine.protocol'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", failing_import)
    with pytest.raises(ImportError) as info:
        app.build_app({"model": "models/does-not-matter"})
    msg = str(info.value)
    assert "vllm.entrypoints.serve.engine.protocol" in msg
    import ray

    assert f"Installed: ray {ray.__version__}" in msg and "built for vllm" in msg and "ternary-serve[gpu]" in msg


def test_bench_serve_records_the_cluster_settings_ternary_serve_prints(tmp_path, monkeypatch):
    from benchmarks.bench_serve import cluster_settings
    from deployments.local import settings_line
    from ternary_plugin import envs

    for name in ("RAY_SERVE_THROUGHPUT_OPTIMIZED", "RAY_SERVE_ENABLE_DIRECT_INGRESS", "RAY_SERVE_ENABLE_HA_PROXY",
                 "RAY_SERVE_LOG_TO_STDERR"):
        monkeypatch.delenv(name, raising=False)
    log = tmp_path / "serve.log"
    log.write_text(f"port check\n{settings_line(envs.cluster_env())}\nstarted\n")
    assert cluster_settings(log) == ("RAY_SERVE_THROUGHPUT_OPTIMIZED=1 RAY_SERVE_ENABLE_DIRECT_INGRESS=0 "
                                     "RAY_SERVE_ENABLE_HA_PROXY=0 "
                                     "RAY_SERVE_LOG_TO_STDERR=1")
    assert cluster_settings(tmp_path / "missing.log") is None


def test_bench_serve_stops_at_a_failed_deploy(tmp_path):
    from benchmarks.bench_serve import deploy_failure

    log = tmp_path / "serve.log"
    log.write_text("starting\n(ServeController) ImportError: vLLM is installed but failed to import\n"
                   "WARNING controller -- Exception importing application 'ternary-embeddings'.\n")
    assert "ImportError: vLLM is installed but failed to import" in deploy_failure(log)
    log.write_text("(raylet) Task build_serve_application failed. There are 3 retries remaining, so the task will "
                   "be retried.\nValueError: model: 'models/x' has no config.json; convert a model first\n")
    assert "ValueError: model: 'models/x' has no config.json" in deploy_failure(log)
    log.write_text("Deployed app 'ternary-embeddings' successfully.\n")
    assert deploy_failure(log) is None


def test_ingress_options_merge_over_serve_llm_defaults():
    """Ray Serve LLM keeps one ingress replica (autoscaling target 1e9); the GPU configs ask for
    2..8, a fixed count replaces the default autoscaling, and the ingress reserves no CPU."""
    from deployments.app import ingress_options
    from deployments.compat import default_ingress_options

    DEFAULT_INGRESS_OPTIONS = default_ingress_options()

    for name in ("tp1.yaml", "tp2.yaml", "tp4.yaml"):
        cfg = TernaryServeConfig.model_validate(_args(REPO / "configs" / name))
        opts = ingress_options(DEFAULT_INGRESS_OPTIONS, cfg.ingress_deployment_config)
        assert opts["autoscaling_config"] == {"target_ongoing_requests": 16, "min_replicas": 2, "max_replicas": 8}
        assert opts["ray_actor_options"] == {"num_cpus": 0}
        assert opts["max_ongoing_requests"] == DEFAULT_INGRESS_OPTIONS["max_ongoing_requests"]
    fixed = ingress_options(DEFAULT_INGRESS_OPTIONS, {"num_replicas": 2, "ray_actor_options": {"num_cpus": 0.5}})
    assert fixed["num_replicas"] == 2 and "autoscaling_config" not in fixed
    assert fixed["ray_actor_options"] == {"num_cpus": 0.5}
    assert ingress_options(DEFAULT_INGRESS_OPTIONS, {})["autoscaling_config"] == DEFAULT_INGRESS_OPTIONS["autoscaling_config"]


def test_activation_dtype_becomes_the_engines_hf_overrides(tiny_bert):
    """activation_dtype -> hf_overrides: the checkpoint's quantization_config with the mode set, the
    config's own hf_overrides kept (their quantization_config keys merged, not replaced)."""
    import json

    base = {**_args(REPO / "configs" / "cpu.yaml"), "model": str(tiny_bert["dst"])}
    qc = json.loads((tiny_bert["dst"] / "config.json").read_text())["quantization_config"]
    assert TernaryServeConfig.model_validate(base).engine_hf_overrides() is None
    user = {"max_position_embeddings": 256, "quantization_config": {"modules_not_converted": []}}
    assert TernaryServeConfig.model_validate({**base, "hf_overrides": user}).engine_hf_overrides() == {
        "max_position_embeddings": 256, "quantization_config": {**qc, "modules_not_converted": []}}
    cfg = TernaryServeConfig.model_validate({**base, "activation_dtype": "int8", "hf_overrides": user})
    assert cfg.engine_hf_overrides() == {
        "max_position_embeddings": 256,
        "quantization_config": {**qc, "modules_not_converted": [], "activation_dtype": "int8"}}
    # what the plugin's config makes of the dict vLLM is handed (vLLM sets it as the attribute)
    pytest.importorskip("vllm")
    from ternary_plugin.config import TernaryConfig

    assert TernaryConfig.from_config(cfg.engine_hf_overrides()["quantization_config"]).w2a8


def test_activation_dtype_errors_name_the_field_and_the_values():
    base = _args(REPO / "configs" / "cpu.yaml")
    with pytest.raises(ValueError, match=r"activation_dtype: 'fp8' is not one of \['bf16', 'fp16', 'none', 'int8'\]"):
        TernaryServeConfig.model_validate({**base, "activation_dtype": "fp8"})
    with pytest.raises(ValueError, match=r"activation_dtype 'int8' disagrees with hf_overrides\.quantization_config\."
                       r"activation_dtype 'bf16': set one of them"):
        TernaryServeConfig.model_validate({**base, "activation_dtype": "int8",
                                           "hf_overrides": {"quantization_config": {"activation_dtype": "bf16"}}})


def test_llm_config_sends_the_hf_overrides(tiny_bert):
    cfg = TernaryServeConfig.model_validate({**_args(REPO / "configs" / "cpu.yaml"), "model": str(tiny_bert["dst"]),
                                             "activation_dtype": "int8"})
    assert llm_config(cfg).engine_kwargs.get("hf_overrides") == cfg.engine_hf_overrides()


def test_haproxys_config_lives_under_the_clusters_temp_dir(monkeypatch):
    """With HAProxy on, `ternary-serve serve` puts Ray's HAProxy config under its own temp dir, so
    that its stop finds HAProxy by command line (it outlives the proxy actor that spawns it); a
    path the caller set wins; with HAProxy off nothing is set."""
    from deployments.local import ClusterOptions, LocalCluster

    monkeypatch.delenv("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", raising=False)
    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "1")
    opts = ClusterOptions(temp_dir=Path("/tmp/tsv"))
    assert LocalCluster(opts, {}).cluster_env["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"] == "/tmp/tsv/haproxy/haproxy.cfg"
    monkeypatch.setenv("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", "/run/mine/haproxy.cfg")
    assert LocalCluster(opts, {}).cluster_env["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"] == "/run/mine/haproxy.cfg"
    monkeypatch.delenv("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC")
    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "0")
    assert "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC" not in LocalCluster(opts, {}).cluster_env


def test_haproxy_is_allowed_the_connections_its_descriptors_cover(monkeypatch):
    """--haproxy turns HAProxy on; its maxconn is Ray 2.60's 4096 unless the file-descriptor hard
    limit is too low for it (~2.5 descriptors a connection: Ray 2.57.1's 20,000 kept HAProxy from
    starting where the limit is 20,000); a maxconn the caller set wins."""
    from deployments.local import ClusterOptions, LocalCluster, haproxy_maxconn

    assert haproxy_maxconn(20_000) == haproxy_maxconn(1 << 20) == 4096
    assert haproxy_maxconn(4096) == 1558 and 1558 * 2.5 + 200 <= 4096
    assert haproxy_maxconn(1024) == 329
    monkeypatch.delenv("RAY_SERVE_ENABLE_HA_PROXY", raising=False)
    monkeypatch.delenv("RAY_SERVE_HAPROXY_MAXCONN", raising=False)
    env = LocalCluster(ClusterOptions(temp_dir=Path("/tmp/tsv"), haproxy=True), {}).cluster_env
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1" and int(env["RAY_SERVE_HAPROXY_MAXCONN"]) <= 4096
    monkeypatch.setenv("RAY_SERVE_HAPROXY_MAXCONN", "100")
    assert LocalCluster(ClusterOptions(haproxy=True), {}).cluster_env["RAY_SERVE_HAPROXY_MAXCONN"] == "100"
    assert "RAY_SERVE_HAPROXY_MAXCONN" not in LocalCluster(ClusterOptions(), {}).cluster_env
