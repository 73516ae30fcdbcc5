"""Make the README's lesson figures from the library: PNG and SVG under figures/.

    .venv/bin/python scripts/make_figures.py [--out figures]

* ``figures/paged_mapping.{png,svg}`` -- the seed's Figure 1: three requests decoding side by side
  in a real :class:`~paged_edu.core.allocator.BlockAllocator` (one finishes, its blocks are reused),
  their contiguous logical blocks mapped to scattered physical blocks.
* ``figures/utilisation.{png,svg}`` -- measured ``eta_paged`` for random lengths against the bound
  ``1 - B/(s+B)`` for B in {8, 16, 32}, and the contiguous ``eta_naive = s / L_max``.

Static images are rendered by plotly's kaleido, which drives a headless Chrome/Chromium: it finds
one on its own, or takes ``BROWSER_PATH`` (set here to Debian's ``/usr/bin/chromium`` when present).
No network is needed.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from paged_edu.core.allocator import BlockAllocator  # noqa: E402
from paged_edu.labs import utilisation  # noqa: E402
from paged_edu.viz import figures, memory_figures  # noqa: E402


def mapping_allocator() -> BlockAllocator:
    """Continuous batching in miniature: A, B, C decode in turns; B finishes; D arrives, and D and A
    grow into the blocks B gave back (2 and 5) -- every sequence ends up scattered over the pool."""
    alloc = BlockAllocator(num_blocks=10, block_size=4, enable_prefix_caching=False)
    token = iter(range(1000, 10_000))
    for seq, n in (("A", 5), ("B", 3), ("C", 6)):
        alloc.allocate(seq, [next(token) for _ in range(n)])
    for step in range(6):
        for seq in ("A", "B", "C"):
            if seq == "B" and step >= 3:
                continue
            alloc.append(seq, next(token))
    alloc.free("B")
    alloc.allocate("D", [next(token) for _ in range(4)])
    for _ in range(2):
        for seq in ("A", "C", "D"):
            alloc.append(seq, next(token))
    return alloc


def utilisation_data(seed: int = 0, num_requests: int = 200, s_max: int = 512) -> dict:
    rng = random.Random(seed)
    measured = {}
    for B in (8, 16, 32):
        lengths = [rng.randint(1, s_max) for _ in range(num_requests)]
        measured[B] = (lengths, [utilisation.measure_eta_paged([s], B) for s in lengths])
    return measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "figures"))
    args = parser.parse_args(argv)
    if "BROWSER_PATH" not in os.environ and Path("/usr/bin/chromium").exists():
        os.environ["BROWSER_PATH"] = "/usr/bin/chromium"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    made = {
        "paged_mapping": figures.logical_physical_figure(
            mapping_allocator(),
            title="PagedAttention: contiguous logical blocks -> scattered physical blocks (B = 4)",
            fixed_width=True,
        ),
        "utilisation": memory_figures.utilisation_figure(utilisation_data(), s_max=512, naive_l_max=512),
    }
    for name, fig in made.items():
        for ext in ("png", "svg"):
            path = out / f"{name}.{ext}"
            fig.write_image(str(path), scale=2 if ext == "png" else 1)
            print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
