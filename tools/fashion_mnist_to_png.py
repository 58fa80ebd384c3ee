#!/usr/bin/env python3
"""Fashion-MNIST's IDX files written out as an ImageFolder of PNG files (gray, 28 x 28):
OUT/train/<label>_<class>/<index>.png and OUT/t10k/..., for `task.images` / `task.val_images`
(docs/performance.md: steps/s from a folder vs from IDX in memory). IDX format: big-endian
header [0, 0, 0x08, ndim], ndim sizes, then the bytes (LeCun's MNIST page; Xiao et al. 2017).

  python tools/fashion_mnist_to_png.py OUT [--idx /usr/share/datasets/fashion-mnist] [--limit N]
"""

import argparse
import gzip
import os

import numpy as np
from PIL import Image

CLASSES = (
    "t-shirt",
    "trouser",
    "pullover",
    "dress",
    "coat",
    "sandal",
    "shirt",
    "sneaker",
    "bag",
    "ankle boot",
)


def read_idx(path: str) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    if data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * d : 8 + 4 * d], "big") for d in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--idx", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--limit", type=int, default=0, help="first N images of each split")
    args = parser.parse_args()
    for split in ("train", "t10k"):
        images = read_idx(os.path.join(args.idx, f"{split}-images-idx3-ubyte.gz"))
        labels = read_idx(os.path.join(args.idx, f"{split}-labels-idx1-ubyte.gz"))
        count = len(labels) if args.limit <= 0 else min(args.limit, len(labels))
        for c, name in enumerate(CLASSES):
            os.makedirs(os.path.join(args.out, split, f"{c}_{name}"), exist_ok=True)
        for i in range(count):
            label = int(labels[i])
            path = os.path.join(args.out, split, f"{label}_{CLASSES[label]}", f"{i:05d}.png")
            Image.fromarray(images[i]).save(path)
        print(f"{split}: {count} images under {os.path.join(args.out, split)}")


if __name__ == "__main__":
    main()
