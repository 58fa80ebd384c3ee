#!/usr/bin/env python3
"""`posenc export RUN --to timm` against timm's own VisionTransformer and Eva (CTest `timm_export`).

For each exported architecture the script makes a small folder of RGB images (PNG, plus a JPEG per
class that only training reads), trains a tiny ViT on it with `posenc train`, exports it, and
checks:
  * timm.create_model(model_name, pretrained=False, **model_args) loads model.safetensors with
    load_state_dict(strict=True), and its logits on images posenc classifies (`posenc eval
    --image`, logits printed to float32 exactness) agree within 1e-5 (float32);
  * weights.safetensors read by safetensors.torch.load_file holds the tensors of weights.pt
    (torch.load), bit for bit.
Architectures: timm's VisionTransformer for a learned table with a class token, 2D sin-cos with
mean pooling, no positions; timm's Eva (attn_type 'rope': its qkv bias includes the key's, as
posenc's) for each rotary encoder with a timm twin: axial RoPE ('rope', per_axis_frequencies) as
rope_type 'cat' (half pairs, rows first, class token; interleaved pairs, columns first
(rope_grid_indexing 'xy'), theta 100, mean pooling, LayerNorm eps 1e-5: the DINOv3 names' eps;
beside a learned table, class token: Naver's RoPE + APE; a composite's part naming both axes
in the grid's order), 'rope_mixed' as 'mixed' (its learned
frequencies repeated over timm's per-block ones), 'rope_dinov3' as 'dinov3' (with DINOv3's
training-time rescale, mean pooling).
Refusals, one line, exit 2: axial RoPE over one frequency ladder (M-RoPE), RoPE-Mixed with half
pairs, DINOv3 RoPE with min/max periods, a composite part rotating by one axis only or by both
in the other order, an encoder
without a timm twin ('rope_fractional'), and a VisionTransformer with torch's LayerNorm eps 1e-5
(timm's is 1e-6).
A padded run (task.pad 4: 24 px into the model) states 24 px in timm's data config, and its
images padded with 4 black pixels a side (posenc's border) pass timm's transform to posenc's
tensors. The images are 16 x 16 = image_size, so neither side resizes; PNG is lossless, and the
normalization is written as posenc's prepare() computes it ((x / 255 - mean) / std in float32);
timm's own eval transform (create_transform of the resolved data config) gives the same tensors
to the bit. An image of another size is resized by posenc with OpenCV (INTER_AREA / bilinear)
and by timm's transform with PIL: other pixels (measured 5e-3 .. 5e-2 in the logits).

  python tests/timm_export_check.py PATH/TO/posenc WORK_DIR
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import safetensors.torch
import timm
import torch
from PIL import Image, ImageOps

TOLERANCE = 1e-5  # float32 logits; posenc's attention kernels and timm's sum in other orders
CLASSES = ("circle", "square", "stripes")
SIZE = 16


def draw(kind: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:SIZE, 0:SIZE]
    colour = rng.integers(80, 256, size=3)
    cy, cx = rng.integers(5, 11, size=2)
    if kind == "circle":
        mask = (y - cy) ** 2 + (x - cx) ** 2 <= 16
    elif kind == "square":
        mask = (abs(y - cy) <= 3) & (abs(x - cx) <= 3)
    else:
        mask = (x + int(seed)) % 4 < 2
    image = rng.integers(0, 40, size=(SIZE, SIZE, 3))
    image[mask] = colour
    return image.astype(np.uint8)


def make_folder(root: str) -> list:
    """train/<class>/ (10 PNG + 1 JPEG each) and val/<class>/ (3 PNG each); returns val files."""
    val_files = []
    for c, kind in enumerate(CLASSES):
        for split, count in (("train", 10), ("val", 3)):
            os.makedirs(os.path.join(root, split, kind), exist_ok=True)
            for i in range(count):
                seed = 1000 * c + 100 * (split == "val") + i
                path = os.path.join(root, split, kind, f"{i:02d}.png")
                Image.fromarray(draw(kind, seed)).save(path)
                if split == "val":
                    val_files.append(path)
        Image.fromarray(draw(kind, 999 + c)).save(os.path.join(root, "train", kind, "x.jpg"))
    return val_files


def config(root: str, name: str, encoder: dict, pooling: str, norm_eps: float = 1e-6,
           pad: int = 0) -> dict:
    return {
        "name": name, "seed": 0, "output": os.path.join(root, "runs", name),
        "task": {"type": "image_classification", "images": os.path.join(root, "train"),
                 "val_images": os.path.join(root, "val"), "image_size": SIZE, "patch": 4,
                 "pad": pad},
        "model": {"dim": 32, "num_heads": 2, "num_layers": 2, "mlp_ratio": 2,
                  "pooling": pooling, "norm_eps": norm_eps},
        "encoder": encoder,
        "train": {"epochs": 3, "batch_size": 8, "lr": 0.003, "warmup_steps": 2, "log_every": 4},
    }


def run(args: list, expect: int = 0) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != expect:
        sys.exit(f"FAIL: {' '.join(args)} exited {done.returncode}, expected {expect}:\n"
                 f"{done.stdout}{done.stderr}")
    return done


def padded(path: str, pad: int) -> Image.Image:
    """The image with `pad` black pixels a side: posenc's 'pad', which the caller adds for timm."""
    return ImageOps.expand(Image.open(path).convert("RGB"), border=pad, fill=0)


def normalized(path: str, mean: list, std: list, pad: int = 0) -> torch.Tensor:
    x = torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1)
    x = x.to(torch.float32).div_(255.0)
    x = torch.nn.functional.pad(x, (pad, pad, pad, pad), value=0.0)  # as posenc's prepare()
    m = torch.tensor(mean, dtype=torch.float64).to(torch.float32).view(-1, 1, 1)
    s = torch.tensor(std, dtype=torch.float64).to(torch.float32).view(-1, 1, 1)
    return (x - m) / s


def check_architecture(posenc: str, root: str, val_files: list, name: str, encoder: dict,
                       pooling: str, norm_eps: float = 1e-6, pad: int = 0) -> None:
    cfg = config(root, name, encoder, pooling, norm_eps, pad)
    cfg_path = os.path.join(root, f"{name}.json")
    with open(cfg_path, "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    run_dir = cfg["output"]
    run([posenc, "train", cfg_path, "--quiet"])
    # weights.safetensors == weights.pt, read by the ecosystem's own readers
    ours = safetensors.torch.load_file(os.path.join(run_dir, "weights.safetensors"))
    pt = torch.load(os.path.join(run_dir, "weights.pt"), weights_only=True)
    assert ours.keys() == pt.keys(), (sorted(ours), sorted(pt))
    for key, value in pt.items():
        assert ours[key].dtype == value.dtype and torch.equal(ours[key], value), key
    run([posenc, "export", run_dir, "--to", "timm"])
    with open(os.path.join(run_dir, "timm", "timm.json"), encoding="utf-8") as f:
        exported = json.load(f)
    model = timm.create_model(exported["model_name"], pretrained=False, **exported["model_args"])
    state = safetensors.torch.load_file(os.path.join(run_dir, "timm", "model.safetensors"))
    model.load_state_dict(state, strict=True)
    model.eval()
    # timm's own data config resolves posenc's preprocessing (not timm's 224 px / 0.5 defaults).
    data = timm.data.resolve_data_config(model=model)
    inp = exported["input"]
    side = inp["image_size"] + 2 * inp["pad"]  # the size the model takes (img_size)
    want = (inp["channels"], side, side)
    assert tuple(data["input_size"]) == want, f"{name}: timm resolves {data['input_size']}"
    assert exported["model_args"]["img_size"] == side, (name, exported["model_args"])
    assert list(data["mean"]) == inp["mean"] and list(data["std"]) == inp["std"], (name, data)
    assert data["crop_pct"] == 1.0 and data["crop_mode"] == "squash", (name, data)
    lines = run([posenc, "eval", cfg_path, "--weights",
                 os.path.join(run_dir, "weights.safetensors")]
                + [a for f in val_files for a in ("--image", f)]).stdout.splitlines()
    rows = [json.loads(line) for line in lines if line.startswith("{")]
    assert len(rows) == len(val_files), lines
    batch = torch.stack([normalized(f, inp["mean"], inp["std"], inp["pad"]) for f in val_files])
    # timm's own eval transform from that data config gives those tensors, to the bit, for images
    # already image_size x image_size, padded as posenc pads them (others it resizes with PIL,
    # not OpenCV: other pixels)
    transform = timm.data.create_transform(**data)
    via_timm = torch.stack([transform(padded(f, inp["pad"])) for f in val_files])
    assert torch.equal(via_timm, batch), f"{name}: timm's eval transform gives other tensors"
    with torch.no_grad():
        theirs = model(batch)
    ours_logits = torch.tensor([r["logits"] for r in rows], dtype=torch.float64)
    diff = (theirs.double() - ours_logits).abs().max().item()
    assert diff <= TOLERANCE, f"{name}: timm's logits differ from posenc's by {diff}"
    assert [r["class"] for r in rows] == [exported["classes"][i] for i in theirs.argmax(-1)]
    args = exported["model_args"]
    what = (f"Eva rope_type {args['rope_type']}" if args.get("use_rot_pos_emb")
            else f"{args['pos_embed']} pos_embed")
    print(f"{name}: {exported['model_name']}, {what}, global_pool {args['global_pool']}: "
          f"max |logit diff| {diff:.2e} over {len(val_files)} images")


def check_refusal(posenc: str, root: str, name: str, encoder: dict, norm_eps: float,
                  expected: str) -> None:
    cfg = config(root, name, encoder, "mean", norm_eps)
    cfg["train"]["epochs"] = 1
    cfg_path = os.path.join(root, f"{name}.json")
    with open(cfg_path, "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    run([posenc, "train", cfg_path, "--quiet"])
    done = run([posenc, "export", cfg["output"], "--to", "timm"], expect=2)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], done.stderr
    print(f"{name}: refused: {lines[0]}")


def main() -> None:
    posenc, root = sys.argv[1], sys.argv[2]
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    torch.set_num_threads(1)
    val_files = make_folder(root)
    check_architecture(posenc, root, val_files, "learned_cls",
                       {"type": "learned_grid", "grid_height": 4, "grid_width": 4}, "cls")
    check_architecture(posenc, root, val_files, "sincos_mean", {"type": "axial_sincos"}, "mean")
    check_architecture(posenc, root, val_files, "nope_mean", {"type": "nope"}, "mean")
    # posenc's black border (IDX data's default pad 2): timm's data config states the model's
    # 24 px, the caller pads the 16 px images
    check_architecture(posenc, root, val_files, "sincos_pad_mean", {"type": "axial_sincos"},
                       "mean", pad=4)
    axial = {"type": "rope", "mrope_section": [4, 4], "per_axis_frequencies": True}  # Dh = 16
    check_architecture(posenc, root, val_files, "rope_cls", axial, "cls")
    check_architecture(posenc, root, val_files, "rope_xy_mean",
                       {**axial, "layout": "interleaved", "section_axes": [1, 0], "rope_theta": 100},
                       "mean", norm_eps=1e-5)
    check_architecture(posenc, root, val_files, "rope_ape_cls",
                       {"type": "compose", "encoders": [
                           {"type": "learned_grid", "grid_height": 4, "grid_width": 4}, axial]},
                       "cls")
    check_architecture(posenc, root, val_files, "rope_mixed_cls", {"type": "rope_mixed"}, "cls")
    check_architecture(posenc, root, val_files, "rope_part_hw_cls",
                       {"type": "compose", "encoders": [{**axial, "axes": ["h", "w"]}]}, "cls")
    check_architecture(posenc, root, val_files, "rope_dinov3_mean",
                       {"type": "rope_dinov3", "rescale_coords": 2}, "mean", norm_eps=1e-5)
    check_refusal(posenc, root, "mrope_refused", {"type": "rope", "mrope_section": [4, 4]}, 1e-6,
                  "the 'rope' encoder takes its frequencies from the 'ladder' source; timm's axial "
                  "RoPE restarts the ladder theta^(-i/(Dh/4)) on each axis (per_axis_frequencies: "
                  "true)")
    check_refusal(posenc, root, "mixed_half_refused", {"type": "rope_mixed", "layout": "half"},
                  1e-6, "timm's RoPE-Mixed requires interleaved pairs (layout: interleaved)")
    check_refusal(posenc, root, "dinov3_periods_refused",
                  {"type": "rope_dinov3", "min_period": 0.5, "max_period": 20}, 1e-6,
                  "timm's Eva builds DINOv3 periods from rope_temperature only")
    check_refusal(posenc, root, "one_axis_refused",
                  {"type": "compose", "encoders": [{"type": "rope", "axes": ["h"]}]}, 1e-6,
                  "the composite's 'rope' part reads the axes [h] of the grid's [h, w]; timm's "
                  "Eva rotates by both, in the grid's order")
    check_refusal(posenc, root, "axes_wh_refused",
                  {"type": "compose", "encoders": [{**axial, "axes": ["w", "h"]}]}, 1e-6,
                  "the composite's 'rope' part reads the axes [w, h] of the grid's [h, w]")
    check_refusal(posenc, root, "fractional_refused",
                  {"type": "rope_fractional", "max_positions": [4, 4]}, 1e-6,
                  "the 'rope_fractional' encoder's rotation has no timm twin")
    check_refusal(posenc, root, "eps_refused", {"type": "axial_sincos"}, 1e-5,
                  "timm's ViT uses 1e-06 (train with model.norm_eps: 1e-6 to export)")


if __name__ == "__main__":
    main()
