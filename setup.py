"""Builds the CUDA kernel (ternary_plugin._C) when torch has CUDA and nvcc is present;
everywhere else the package installs without it and the plugin uses the reference path.

TERNARY_BUILD_CUDA=0 skips the build, =1 makes a missing toolchain an error.
"""

import os

from setuptools import setup

ext_modules, cmdclass = [], {}
want = os.environ.get("TERNARY_BUILD_CUDA", "auto")
if want != "0":
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension

        have_cuda = torch.version.cuda is not None and CUDA_HOME is not None
    except ImportError:
        have_cuda = False
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
                 "csrc/ternary_wgmma.cu"],
                depends=["csrc/ternary_common.cuh", "csrc/ternary_mma.cuh", "csrc/ternary_wgmma.h"],
                extra_compile_args={
                    "cxx": ["-O3", "-std=c++17"],
                    "nvcc": ["-O3", "-std=c++17", "--use_fast_math", "-lineinfo", *gencode],
                },
            )
        ]
        cmdclass = {"build_ext": BuildExtension}
    elif want == "1":
        raise RuntimeError("TERNARY_BUILD_CUDA=1 but torch has no CUDA or nvcc (CUDA_HOME) is missing")

setup(ext_modules=ext_modules, cmdclass=cmdclass)
