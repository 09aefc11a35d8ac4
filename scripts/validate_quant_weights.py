"""Validate a ternary checkpoint at three levels, one line each:

    CPU_UNPACK: OK|FAIL <detail>
    GPU_LOAD:   OK|FAIL|SKIP <detail>
    TP_SHARD:   OK|FAIL <detail>

    python scripts/validate_quant_weights.py MODEL_DIR [--tp 2 4 8] [--reference FP_DIR]

Exit status 1 when any level FAILs, 0 otherwise. --reference adds per-layer relative error
against the unquantized model (printed after the three lines).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from ternary_plugin.validate import FAIL, validate

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4, 8], help="tensor-parallel sizes for TP_SHARD")
    ap.add_argument("--reference", type=Path, help="the unquantized model, for per-layer relative error")
    args = ap.parse_args(argv)
    levels, extra = validate(args.model_dir, args.tp, args.reference)
    for level in levels:
        print(level.line())
    for line in extra:
        print(f"  {line}")
    return 1 if any(level.status == FAIL for level in levels) else 0


if __name__ == "__main__":
    sys.exit(main())
