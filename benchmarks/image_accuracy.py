"""Accuracy and cost of the crop-decode (``shardpipes.formats.image``) on the jpeg preset.

    python benchmarks/image_accuracy.py                 # every image of the preset, 3 rounds

For each photograph, one random resized crop box (torchvision's draws, seed 0) and three ways
to the 224x224 crop:

- reference: Pillow's full decode, then ``resize((224, 224), BILINEAR, box=box)``;
- ``exact=True``: decoded down to the rows the crop needs, the same Pillow resize;
- ``exact=False`` (the stage's default): the crop's pixels resized by torch's antialiased
  bilinear filter, DCT scaling when the crop is at least twice the output.

Accuracy is over uint8 pixels (before normalisation): how many crops are bit-identical to the
reference, the largest absolute difference, and PSNR (dB). Cost: CPU time per sample of the
whole transform (decode, crop, resize, flip, float tensor, normalise) for the shared transform
every peer runs (``_work.jpeg_transform``) and the two modes, as ratios, best of the rounds,
in one process with one thread.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import _data  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--preset", default="jpeg")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache-dir", default=os.path.join(REPO, ".bench", "data"))
    args = ap.parse_args(argv)
    import _work
    import numpy as np
    import torch
    from PIL import Image

    from shardpipes.formats import image as fi

    torch.set_num_threads(1)
    m = _data.ensure_dataset(_data.PRESETS[args.preset], args.cache_dir, print)
    images = []
    for path in m["paths"]:
        with tarfile.open(path) as tar:
            images += [tar.extractfile(i).read() for i in tar if i.name.endswith(".jpg")]
    rng = random.Random(0)
    same, worst, psnrs, fast_same = 0, 0, [], 0
    for data in images:
        full = Image.open(io.BytesIO(data)).convert("RGB")
        box = fi.random_resized_crop_box(rng, *full.size)
        ref = np.asarray(full.resize((224, 224), Image.Resampling.BILINEAR, box=box)).astype(int)
        exact = fi.decode_crop_tensor(data, (224, 224), box, exact=True).permute(1, 2, 0).numpy()
        same += bool((exact.astype(int) == ref).all())
        fast = fi.decode_crop_tensor(data, (224, 224), box).permute(1, 2, 0).numpy().astype(int)
        diff = np.abs(fast - ref)
        worst = max(worst, int(diff.max()))
        mse = float((diff**2).mean())
        fast_same += mse == 0
        psnrs.append(float("inf") if mse == 0 else 10 * np.log10(255**2 / mse))
    n = len(images)
    print(f"{args.preset}: {n} photographs, one random resized crop each, 224x224")
    print(f"exact=True:  {same}/{n} crops bit-identical to full decode + Pillow resize")
    finite = [p for p in psnrs if p != float("inf")]
    print(
        f"exact=False: max abs difference {worst} (of 255); PSNR min {min(finite):.1f} dB, "
        f"median {float(np.median(finite)):.1f} dB; {fast_same} crops identical"
    )

    draws = random.Random(1)

    def fused(data: bytes, exact: bool) -> object:
        return fi.decode_crop_tensor(
            data,
            (224, 224),
            exact=exact,
            flip=draws.random() < 0.5,
            mean=fi.IMAGENET_MEAN,
            std=fi.IMAGENET_STD,
            box_fn=lambda w, h: fi.random_resized_crop_box(draws, w, h),
        )

    ways = {
        "shared transform (full decode, Pillow)": _work.jpeg_transform,
        "exact=True": lambda d: fused(d, True),
        "exact=False": lambda d: fused(d, False),
    }
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(args.rounds):
        for name, fn in ways.items():
            t0 = time.process_time()
            for data in images:
                fn(data)
            best[name] = min(best[name], (time.process_time() - t0) / n)
    base = best["shared transform (full decode, Pillow)"]
    print("CPU per sample, relative to the shared transform (best of rounds):")
    for name, sec in best.items():
        print(f"  {name}: {sec / base:.2f} ({base / sec:.2f}x samples per CPU-second)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
