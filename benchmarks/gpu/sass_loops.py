"""Per kernel of a cuobjdump -sass listing: its local-memory spill instructions (STL/LDL), and how
many sit inside each loop that issues wgmma (HGMMA/IGMMA), i.e. in a k-loop. What ptxas's
"N bytes spill stores" does not say: where the spills are.

    python benchmarks/gpu/sass_loops.py .nvcc/ternary_wgmma_s8.sass [name-filter]
"""

from __future__ import annotations

import re
import sys


def loops(lines: list[str]) -> list[tuple[int, int, int]]:
    """(first, last, spill instructions) of each backward branch's span that holds a wgmma."""
    addr = [int(re.match(r"\s+/\*([0-9a-f]+)\*/", ln).group(1), 16) for ln in lines]
    index = {a: i for i, a in enumerate(addr)}
    mma = [i for i, ln in enumerate(lines) if re.search(r"\b[HI]GMMA", ln)]
    out = []
    for i, ln in enumerate(lines):
        m = re.search(r"BRA (0x[0-9a-f]+)", ln)
        if not m or int(m.group(1), 16) >= addr[i] or int(m.group(1), 16) not in index:
            continue
        j = index[int(m.group(1), 16)]
        if any(j <= g <= i for g in mma):
            out.append((j, i, sum(bool(re.search(r"\b(STL|LDL)", lines[k])) for k in range(j, i + 1))))
    return out


def main(argv: list[str]) -> int:
    text = open(argv[0]).read().split("Function : ")[1:]
    pattern = argv[1] if len(argv) > 1 else ""
    for fn in text:
        name = fn.split("\n")[0].strip()
        if pattern not in name:
            continue
        lines = [ln for ln in fn.split("\n") if re.match(r"\s+/\*[0-9a-f]{4,}\*/", ln)]
        spills = sum(bool(re.search(r"\b(STL|LDL)", ln)) for ln in lines)
        spans = "; ".join(f"loop {a}-{b}: {n} spill" for a, b, n in sorted(loops(lines), key=lambda t: t[1] - t[0]))
        print(f"{name[:110]}\n  {len(lines)} instructions, {spills} spill; {spans or 'no wgmma loop'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
