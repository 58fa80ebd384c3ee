"""docs/python.md's examples run as written: every ```python block of the page, each on its own in
a fresh namespace and an empty working folder, as a reader pastes it. Each block asserts its own
claim against the peer's code (transformers', timm's and diffusers' models with and without
patch(), SDPA over the plan's parts, the compiled function against the eager one), so a block
that stops being true fails here, not in a reader's hands."""

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(ROOT, "docs", "python.md")


def blocks() -> list[tuple[str, str]]:
    """(section title, code) for every python block of the page, in order."""
    with open(PAGE, encoding="utf-8") as f:
        text = f.read()
    out = []
    for section in re.split(r"\n## ", text)[1:]:
        title = section.split("\n", 1)[0].strip()
        for code in re.findall(r"```python\n(.*?)```", section, flags=re.S):
            out.append((title, code))
    return out


def test_the_page_has_an_example_per_task():
    titles = {title for title, _ in blocks()}
    for task in (
        "Patch a transformers model",
        "Patch a timm model",
        "Patch a diffusers model",
        "Call the operators",
        "Build an encoder",
        "Compile and export",
    ):
        assert task in titles, f"docs/python.md: no example under '## {task}'"


@pytest.mark.parametrize("title,code", blocks(), ids=[t for t, _ in blocks()])
def test_the_example_runs_as_written(title, code, tmp_path, monkeypatch):
    for peer in re.findall(r"^import (transformers|timm|diffusers)\b", code, flags=re.M):
        pytest.importorskip(peer)
    if re.search(r"^from (timm|diffusers)\b", code, flags=re.M):
        pytest.importorskip(re.search(r"^from (timm|diffusers)\b", code, flags=re.M).group(1))
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"docs/python.md ({title})", "exec"), {"__name__": "docs_python"})
