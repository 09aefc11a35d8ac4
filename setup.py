"""Builds ternary_plugin._C: the CUDA kernels where torch has CUDA and nvcc is present, the CPU
kernel (csrc/cpu/, AVX-512 chosen at run time) everywhere; the op schema (csrc/ternary_schema.cpp)
in both. Without the extension the plugin uses the pure-torch reference path.

TERNARY_BUILD_CUDA=0 skips the CUDA kernels, =1 makes a missing CUDA toolchain an error.
TERNARY_BUILD_CPU=0 skips the CPU kernel; with both skipped (or CUDA absent) there is no _C.
"""

import os

from setuptools import setup

CPU_SOURCES = ["csrc/cpu/ternary_cpu.cpp", "csrc/cpu/ternary_cpu_kernels.cpp", "csrc/cpu/ternary_cpu_avx2.cpp",
               "csrc/cpu/ternary_cpu_w2a8.cpp", "csrc/cpu/ternary_cpu_w2a8_avx2.cpp"]
SCHEMA = ["csrc/ternary_schema.cpp"]
# No -march: the wheel must load on any x86-64; the AVX-512 functions carry target attributes.
# -fopenmp: at::parallel_for is header code, serial unless the extension itself is built with
# OpenMP (measured: 2 threads no faster than 1 without it); the process shares torch's libgomp.
CXX_FLAGS = ["-O3", "-std=c++17", "-fopenmp"]
LINK_FLAGS = ["-fopenmp"]

ext_modules, cmdclass = [], {}
want_cuda = os.environ.get("TERNARY_BUILD_CUDA", "auto")
want_cpu = os.environ.get("TERNARY_BUILD_CPU", "1") != "0"
try:
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
except ImportError:
    torch = None
have_cuda = torch is not None and want_cuda != "0" and torch.version.cuda is not None and CUDA_HOME is not None
if want_cuda == "1" and not have_cuda:
    raise RuntimeError("TERNARY_BUILD_CUDA=1 but torch has no CUDA or nvcc (CUDA_HOME) is missing")
cpu = CPU_SOURCES if want_cpu else []

if have_cuda:
    # sm_90a for Hopper (wgmma-capable), sm_80 as the generic target, PTX for newer chips.
    archs = os.environ.get("TERNARY_CUDA_ARCHS", "80;90a")
    gencode = []
    for a in archs.split(";"):
        gencode += [f"-gencode=arch=compute_{a},code=sm_{a}"]
    gencode += ["-gencode=arch=compute_80,code=compute_80"]
    ext_modules = [
        CUDAExtension(
            "ternary_plugin._C",
            ["csrc/ternary_ops.cpp", "csrc/ternary_gemm.cu", "csrc/ternary_mma.cu", "csrc/ternary_tiled.cu",
             "csrc/ternary_wgmma.cu", "csrc/ternary_wgmma_s8.cu", "csrc/ternary_humming_gemv.cu", *SCHEMA, *cpu],
            depends=["csrc/ternary_common.cuh", "csrc/ternary_mma.cuh", "csrc/ternary_wgmma.h", "csrc/ternary_wgmma.cuh",
                     "csrc/ternary_wgmma_s8.h", "csrc/ternary_check.h", "csrc/cpu/ternary_cpu.h", "csrc/cpu/ternary_cpu_tiles.h"],
            extra_link_args=LINK_FLAGS,
            extra_compile_args={
                "cxx": CXX_FLAGS,
                "nvcc": ["-O3", "-std=c++17", "--use_fast_math", "-lineinfo", *gencode],
            },
        )
    ]
elif torch is not None and cpu:
    ext_modules = [
        CppExtension(
            "ternary_plugin._C",
            [*SCHEMA, *cpu],
            depends=["csrc/ternary_check.h", "csrc/cpu/ternary_cpu.h", "csrc/cpu/ternary_cpu_tiles.h"],
            extra_compile_args={"cxx": CXX_FLAGS},
            extra_link_args=LINK_FLAGS,
        )
    ]
if ext_modules:
    cmdclass = {"build_ext": BuildExtension}

setup(ext_modules=ext_modules, cmdclass=cmdclass)
