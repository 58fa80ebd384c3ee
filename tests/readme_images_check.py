#!/usr/bin/env python3
"""The README's "Train on your images" quick start, run as written (CTest `readme_your_images`).

Its bash block and its Python block are read from README.md. In a fresh folder the script makes
what the quick start assumes: shapes/<class>/ with small PNG and JPEG images of three classes
(circles, squares, stripes) and a new image new.png, plus configs/ (the repository's). The bash
block runs with the built `posenc` first on PATH (each command must exit 0; `posenc eval --image`
must print one JSON line naming a class), then the Python block, whose `model` must be timm's
VisionTransformer with the run's classes and give posenc's logits for new.png (within 1e-5).

  python tests/readme_images_check.py PATH/TO/posenc WORK_DIR
"""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import torch
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def blocks() -> tuple:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme.split("## Train on your images", 1)[1].split("\n## ", 1)[0]
    bash = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    python = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(bash) == 1 and len(python) == 1, "expected one bash and one python block"
    return bash[0], python[0]


def draw(kind: str, seed: int, size: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size] * (32 / size)
    cy, cx = rng.uniform(10, 22, size=2)
    if kind == "circles":
        mask = (y - cy) ** 2 + (x - cx) ** 2 <= 49
    elif kind == "squares":
        mask = (abs(y - cy) <= 6) & (abs(x - cx) <= 6)
    else:
        mask = (x.astype(int) + seed) % 8 < 4
    image = rng.integers(0, 50, size=(size, size, 3))
    image[mask] = rng.integers(120, 256, size=3)
    return image.astype(np.uint8)


def main() -> None:
    posenc, work = os.path.abspath(sys.argv[1]), sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    os.chdir(work)
    os.symlink(os.path.join(ROOT, "configs"), "configs")
    for c, kind in enumerate(("circles", "squares", "stripes")):
        os.makedirs(os.path.join("shapes", kind))
        for i in range(30):  # photos come in all sizes: 24 to 48 px, resized to 32
            image = Image.fromarray(draw(kind, 100 * c + i, 24 + (i % 3) * 12))
            image.save(os.path.join("shapes", kind, f"{i:02d}." + ("jpg" if i % 5 == 0 else "png")))
    Image.fromarray(draw("circles", 999, 32)).save("new.png")  # 32 x 32: posenc does not resize
    bash, python = blocks()
    env = dict(os.environ, PATH=os.path.dirname(posenc) + os.pathsep + os.environ["PATH"])
    env.pop("POSENC_PARENT_PID", None)
    predicted = None
    for line in bash.strip().splitlines():
        command = line.split("#", 1)[0].strip()
        if not command:
            continue
        done = subprocess.run(command, shell=True, env=env, capture_output=True, text=True,
                              check=False)
        assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout}{done.stderr}"
        if " eval " in command and "--image" in command:
            rows = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
            assert len(rows) == 1 and rows[0]["class"], done.stdout
            predicted = rows[0]
        print(f"ok: {command}")
    assert predicted is not None, "the bash block has no posenc eval --image"
    namespace = {}
    exec(compile(python, "README.md (Train on your images)", "exec"), namespace)  # noqa: S102
    model, cfg = namespace["model"], namespace["cfg"]
    assert type(model).__name__ == "VisionTransformer", type(model)
    assert model.num_classes == len(cfg["classes"]) == 3
    # new.png as posenc prepares it ((x / 255 - mean) / std, float32): timm's logits are posenc's
    x = torch.from_numpy(np.array(Image.open("new.png").convert("RGB"))).permute(2, 0, 1)
    mean = torch.tensor(cfg["input"]["mean"], dtype=torch.float64).float().view(-1, 1, 1)
    std = torch.tensor(cfg["input"]["std"], dtype=torch.float64).float().view(-1, 1, 1)
    with torch.no_grad():
        logits = model.eval()(((x.float().div_(255.0) - mean) / std)[None])
    diff = (logits[0].double() - torch.tensor(predicted["logits"], dtype=torch.float64)).abs()
    assert diff.max().item() <= 1e-5, f"timm's logits differ from posenc's by {diff.max().item()}"
    print(f"ok: python block: {type(model).__name__}, classes {cfg['classes']}; "
          f"posenc says new.png is '{predicted['class']}' (p = {predicted['probability']:.3f})")


if __name__ == "__main__":
    main()
