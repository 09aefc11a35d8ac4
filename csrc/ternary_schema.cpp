// The op schema of torch.ops.ternary_serve.*, compiled into every build of ternary_plugin._C:
// the CUDA implementations are in csrc/ternary_ops.cpp, the CPU one in csrc/cpu/ternary_cpu.cpp,
// the fake (meta) implementations for torch.compile and CUDA graphs in ternary_plugin/ops.py.

#include <torch/library.h>

TORCH_LIBRARY(ternary_serve, m) {
  // pdl: programmatic dependent launch of the tensor-core kernel (see the dispatch notes in
  // csrc/ternary_ops.cpp); the CPU kernel ignores it
  m.def("gemm(Tensor x, Tensor packed, Tensor scale, Tensor? bias, int block_size, int k_offset, bool pdl=False) "
        "-> Tensor");
  // One kernel forced (path 1 gemv, 2 tensor-core, 3 dequantize + cuBLAS, 4 tiled tensor-core,
  // 5 wgmma; rows_per_cta, k_split, k_unit and warps, the tensor-core kernel's W rows per CTA,
  // CTAs per tile along K, weights of K per unit of work and warps a CTA (launch_mma), the tiled
  // kernel's W rows (and tokens) per CTA, the wgmma kernel's W rows per CTA with tokens_per_cta
  // and its CTAs a tile along K (k_split, a cluster), 0 = auto): for tests and benchmarks; gemm
  // chooses the kernel by ternary_plugin/dispatch.py's table (a Python CUDA implementation, ops.py),
  // every tile choice automatic. mma64_max_k: TERNARY_MMA64_MAX_K, the tensor-core kernel's auto unit.
  m.def("gemm_path(Tensor x, Tensor packed, Tensor scale, Tensor? bias, int block_size, int k_offset, int path, "
        "int rows_per_cta, int k_split=0, int k_unit=0, int tokens_per_cta=0, int warps=0, bool pdl=False, "
        "int mma64_max_k=1024) -> Tensor");
  // The int8-activation (W2A8) mode (ternary_plugin/activations.py says its numerics): x float
  // [M, K] quantized per token to int8 inside the op (absmax / 127, round half to even), exact
  // integer dots against the codes a scale block at a time, fp32 scale products; y in x's dtype.
  // CPU: csrc/cpu/; CUDA: a Python implementation (ternary_plugin/ops.py) that takes Humming's
  // int2 x int8 layer or gemm_w2a8_path (the s8 wgmma kernel, csrc/ternary_wgmma_s8.cu; its tile
  // forced for tests and benchmarks, 0 = auto) by ternary_plugin/dispatch.py's table.
  m.def("gemm_w2a8(Tensor x, Tensor packed, Tensor scale, Tensor? bias, int block_size, int k_offset) -> Tensor");
  m.def("gemm_w2a8_path(Tensor x, Tensor packed, Tensor scale, Tensor? bias, int block_size, int k_offset, "
        "int k_split=0, bool fold=False, int rows=0) -> Tensor");
  // The mode's activation quantization alone: (xq int8 [M, K], sx float32 [M]), for tests.
  m.def("quantize_int8(Tensor x) -> (Tensor, Tensor)");
  // M <= 16 over a layer's Humming int2 group-128 tensors (float activations): weight int32
  // [K/16, N] and weight_scale [K/128, N] as HummingLayer.transform() leaves them, bias in W's row
  // order (csrc/ternary_humming_gemv.cu); CUDA only. k_split: CTAs along K, 0 = auto.
  m.def("humming_gemv(Tensor x, Tensor weight, Tensor weight_scale, Tensor? bias, int k_split=0) -> Tensor");
  m.def("dequantize(Tensor packed, Tensor scale, int K, int block_size, int k_offset, ScalarType dtype) -> Tensor");
}

// Importing the module registers the ops (a PyInit that does nothing else).
#include <Python.h>
static struct PyModuleDef ternary_module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&ternary_module); }
