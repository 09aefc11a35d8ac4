"""The typed configuration of a ternary embedding application (the ``args`` of a Serve
config's application). Unknown keys are refused; every field says what it does."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

API_KEY_ENV = "TERNARY_API_KEY"
MODEL_ROOT_ENV = "TERNARY_MODEL_ROOT"
SERVER_CLASS = "deployments.server:TernaryLLMServer"
WORKER_EXTENSION = "ternary_plugin.worker_ext:TernaryWorkerExtension"
# The replicas' deployment is named "TernaryLLMServer:<model_id>" whichever server_class serves it:
# the reconciliation job and operators find the deployments by this prefix.
DEPLOYMENT_PREFIX = "TernaryLLMServer:"


def import_class(path: str) -> type:
    """``"package.module:Class"`` -> the class."""
    module, _, name = path.partition(":")
    if not module or not name:
        raise ValueError(f"{path!r} is not an import path of the form 'package.module:Class'")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import {path!r}: {exc}") from None


class Autoscaling(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min_replicas: int = Field(1, ge=0, description="replicas kept when idle")
    max_replicas: int = Field(1, ge=1, description="upper bound under load")
    initial_replicas: Optional[int] = Field(None, ge=0, description="replicas at start (default min_replicas)")
    target_ongoing_requests: float = Field(8, gt=0, description="ongoing requests per replica to aim for")
    upscale_delay_s: float = Field(5, ge=0, description="load must persist this long before adding a replica")
    downscale_delay_s: float = Field(30, ge=0, description="idleness must persist this long before removing one")

    @model_validator(mode="after")
    def _bounds(self):
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"autoscaling.min_replicas ({self.min_replicas}) > max_replicas ({self.max_replicas}): "
                "raise max_replicas or lower min_replicas"
            )
        return self


class TernaryServeConfig(BaseModel):
    """One embedding model served by vLLM replicas behind an OpenAI-compatible ingress."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        ...,
        description=f"ternary checkpoint directory; a relative path is taken from ${MODEL_ROOT_ENV} where set, else "
        "from the working directory of the process that builds the application (`ternary-serve serve` makes it "
        "absolute against yours before it starts the cluster)",
    )
    model_id: Optional[str] = Field(None, description="name clients send as `model` (default: the directory name)")
    device: Literal["cpu", "gpu"] = Field("cpu", description="where the vLLM engines run")
    tensor_parallel_size: int = Field(1, ge=1, le=8, description="GPUs (or CPU workers) per replica")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description="activation dtype")
    max_model_len: Optional[int] = Field(None, ge=1, description="longest input in tokens (default: the model's)")
    max_num_batched_tokens: Optional[int] = Field(None, ge=1, description="tokens per engine step")
    enforce_eager: bool = Field(False, description="skip torch.compile / CUDA graphs (faster start)")
    disable_custom_all_reduce: bool = Field(
        False, description="use NCCL all-reduce only (hosts where NVLink multicast must stay off, e.g. the lent H200s)"
    )
    placement_strategy: Literal["STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD"] = Field(
        "STRICT_PACK", description="how a replica's bundles (one per TP worker) are placed"
    )
    cpus_per_worker: float = Field(1, gt=0, description="Ray CPUs reserved per TP worker")
    autoscaling: Autoscaling = Field(default_factory=Autoscaling)
    max_ongoing_requests: int = Field(64, ge=1, description="requests a replica works on at once")
    max_queued_requests: int = Field(-1, ge=-1, description="requests waiting per deployment before 503 (-1: no bound)")
    health_check_period_s: float = Field(10, gt=0, description="Serve replaces a replica after 3 failed checks in a row")
    health_check_timeout_s: float = Field(30, gt=0)
    graceful_shutdown_timeout_s: float = Field(
        30, ge=0, description="a replica leaving (scale-down, replacement) finishes its in-flight requests for up "
        "to this long; Serve routes no new ones to it")
    api_key: Optional[SecretStr] = Field(
        None, description="Bearer key clients must send; better left out of the file (it is stored with the Serve "
        "config): the key is then read from the variable api_key_env names, on the cluster")
    api_key_env: str = Field(API_KEY_ENV, description="environment variable holding the key where api_key is unset")
    allow_unauthenticated: bool = Field(
        False, description="serve without an API key on a non-loopback HTTP host (refused otherwise)")
    max_body_bytes: int = Field(2 * 1024 * 1024, ge=1024, description="larger request bodies get 413")
    max_inputs: int = Field(2048, ge=1, description="inputs per request; more get 400")
    engine_env: dict[str, str] = Field(default_factory=dict, description="extra environment for the engines")
    activation_dtype: Optional[str] = Field(
        None, description="the ternary layers' activation mode for this deployment: 'int8' quantizes activations "
        "to int8 per token (W2A8: int8 tensor cores where they are the limit, at a cost of about 1e-4 in embedding "
        "cosine, README); 'bf16', 'fp16' or 'none': activations in the engine's dtype. Default: the checkpoint's "
        "quantization_config.activation_dtype (absent: the engine's dtype). Sent to vLLM in hf_overrides")
    hf_overrides: dict[str, Any] = Field(
        default_factory=dict, description="vLLM's hf_overrides for the engines (config.json keys to override). "
        "Its quantization_config, if any, lists changes to the checkpoint's (e.g. {activation_scales: token_block}), "
        "and activation_dtype is merged into it: vLLM replaces a dict-valued key whole, so the one sent is the "
        "checkpoint's with these keys over it")
    ingress_deployment_config: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Ray Serve deployment options for the HTTP ingress, merged over Ray Serve LLM's defaults as its "
            "LLMServingArgs.ingress_deployment_config is, e.g. {num_replicas: 2} or {autoscaling_config: "
            "{min_replicas: 2, max_replicas: 8, target_ongoing_requests: 16}}. Ray Serve LLM keeps one ingress "
            "replica otherwise; on the H200 one carried about 120 requests/s (benchmarks/results/e2e-h200.md)"
        ),
    )

    server_class: str = Field(
        SERVER_CLASS,
        description="the replica's LLMServer class, 'module:Class'; must subclass TernaryLLMServer (tests swap in a "
        "fault-injecting subclass)",
    )
    worker_extension: str = Field(
        WORKER_EXTENSION,
        description="the vLLM worker extension, 'module:Class'; must subclass TernaryWorkerExtension",
    )

    @field_validator("server_class", "worker_extension")
    @classmethod
    def _subclass_of_ours(cls, value: str, info) -> str:
        """Refused here, before any replica starts: a class that cannot be imported or that drops the
        plugin's checks (the health check proves every worker loaded the plugin)."""
        base = import_class(SERVER_CLASS if info.field_name == "server_class" else WORKER_EXTENSION)
        chosen = import_class(value)
        if not (isinstance(chosen, type) and issubclass(chosen, base)):
            raise ValueError(f"{info.field_name}: {value!r} is not a subclass of {base.__module__}.{base.__name__}")
        return value

    @field_validator("activation_dtype")
    @classmethod
    def _activation_dtype(cls, value: Optional[str]) -> Optional[str]:
        from ternary_plugin.activations import ACTIVATION_DTYPES

        if value is not None and value not in ACTIVATION_DTYPES:
            raise ValueError(f"activation_dtype: {value!r} is not one of {list(ACTIVATION_DTYPES)} ('int8': W2A8)")
        return value

    @model_validator(mode="after")
    def _one_activation_dtype(self):
        from ternary_plugin.activations import ACTIVATION_DTYPE_KEY

        given = (self.hf_overrides.get("quantization_config") or {}).get(ACTIVATION_DTYPE_KEY)
        if self.activation_dtype is not None and given is not None and given != self.activation_dtype:
            raise ValueError(f"activation_dtype {self.activation_dtype!r} disagrees with hf_overrides."
                             f"quantization_config.{ACTIVATION_DTYPE_KEY} {given!r}: set one of them")
        return self

    def engine_hf_overrides(self) -> Optional[dict[str, Any]]:
        """The engines' ``hf_overrides`` (None when there are none): the config's own, their
        quantization_config keys and activation_dtype merged over the checkpoint's (reads its config.json)."""
        from ternary_plugin.activations import activation_overrides

        return activation_overrides(self.model_path, self.activation_dtype, self.hf_overrides) or None

    @field_validator("ingress_deployment_config")
    @classmethod
    def _ingress_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        """Ray Serve's own schema: unknown options and bad autoscaling bounds are refused here,
        not when the controller deploys the ingress."""
        from ray.serve.config import AutoscalingConfig
        from ray.serve.schema import DeploymentSchema

        allowed = set(DeploymentSchema.model_fields) - {"name"}  # the name is the app's
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise ValueError(f"ingress_deployment_config: unknown or fixed option(s) {unknown}; allowed: {sorted(allowed)}")
        if value.get("max_queued_requests", -1) not in (-1, None):
            # The proxy refuses what overflows the ingress's queue before any ingress code runs, as
            # plain text without Retry-After (Ray 2.60: "Request dropped due to backpressure
            # (num_queued_requests=4, max_queued_requests=4)."): no OpenAI shape is possible there.
            raise ValueError(
                f"ingress_deployment_config: max_queued_requests {value['max_queued_requests']!r} is refused: Serve's "
                "proxy answers a full ingress queue in plain text without Retry-After. Bound the model's queue "
                "instead (the application's max_queued_requests), which the ingress answers as an OpenAI error "
                "with Retry-After")
        try:
            DeploymentSchema(name="ingress", **value)
            if value.get("autoscaling_config") is not None:
                AutoscalingConfig(**value["autoscaling_config"])
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            errors = getattr(exc, "errors", None)
            why = "; ".join(e["msg"] for e in errors()) if callable(errors) else str(exc)
            raise ValueError(f"ingress_deployment_config: {why}") from None
        return value

    @property
    def model_path(self) -> Path:
        """The checkpoint directory, absolute. Serve builds applications in a Ray worker whose
        working directory is the cluster's, not the user's: ${MODEL_ROOT_ENV} anchors relative paths
        where set (`ternary-serve serve` resolves them against the caller's directory instead)."""
        path = Path(self.model).expanduser()
        if path.is_absolute():
            return path
        return (Path(os.environ.get(MODEL_ROOT_ENV) or os.getcwd()) / path).resolve()

    def check_model_dir(self) -> Path:
        """Refuse, before any replica starts, a model directory that is not there."""
        if not (self.model_path / "config.json").is_file():
            raise ValueError(
                f"model: {self.model!r} ({self.model_path}) has no config.json; "
                "convert a model first: ternary-serve convert SRC DST"
            )
        return self.model_path

    @property
    def served_name(self) -> str:
        return self.model_id or self.model_path.resolve().name

    @property
    def resolved_api_key(self) -> Optional[str]:
        if self.api_key is not None and self.api_key.get_secret_value():
            return self.api_key.get_secret_value()
        return os.environ.get(self.api_key_env) or None

    def check_exposure(self, http_host: str) -> None:
        """Closed by default: an HTTP host beyond loopback needs an API key, or an explicit opt-out."""
        if is_loopback(http_host) or self.resolved_api_key or self.allow_unauthenticated:
            return
        raise ValueError(
            f"http_options.host is {http_host!r} (reachable beyond this machine) and no API key is set: export "
            f"{self.api_key_env}=<key> on the cluster (or set api_key_env to the variable that holds it), or set "
            "allow_unauthenticated: true in the application's args to serve without one"
        )


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
