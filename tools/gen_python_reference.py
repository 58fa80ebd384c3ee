"""Generate docs/python_reference.md, the Python API reference, from the package's docstrings.

The contract of each public name (the exact peer function it reproduces, shapes, dtypes, what it
refuses) lives in its docstring, next to the code; this page collects them so that they can be
read in one place: for posenc, posenc.timm_layers and every posenc.integrations module, the module's
docstring, then each name of its __all__ with its signature (inspect.signature) and its own
docstring (not one inherited from nn.Module), and for a class its public methods defined in the
class itself (a method without a docstring: its signature alone). Docstrings are
copied verbatim into text blocks (they hold [B, H, N, D] shapes and formulas that Markdown would
mangle). Nothing here is written by hand.

    PYTHONPATH=python POSENC_OPS_LIBRARY=build/libposenc_ops.so python tools/gen_python_reference.py
    ... python tools/gen_python_reference.py --check   # exit 1 if the page is not current

tests/python/test_python_reference.py runs --check's comparison in the Python suite.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import pkgutil
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "python_reference.md")
COMMAND = (
    "PYTHONPATH=python POSENC_OPS_LIBRARY=build/libposenc_ops.so "
    "python tools/gen_python_reference.py"
)
BASE_MODULES = ("posenc", "posenc.timm_layers")


def modules() -> list[str]:
    """posenc, posenc.timm_layers and every public posenc.integrations module (found, not listed)."""
    integrations = importlib.import_module("posenc.integrations")
    found = sorted(
        f"posenc.integrations.{m.name}"
        for m in pkgutil.iter_modules(integrations.__path__)
        if not m.name.startswith("_")
    )
    return [*BASE_MODULES, *found]


class _Written:
    """An annotation as written: `from __future__ import annotations` keeps annotations as strings,
    which inspect would print quoted ('int')."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _as_written(annotation):
    return _Written(annotation) if isinstance(annotation, str) else annotation


def signature(obj) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    sig = sig.replace(
        parameters=[
            p.replace(annotation=_as_written(p.annotation)) for p in sig.parameters.values()
        ],
        return_annotation=_as_written(sig.return_annotation),
    )
    text = str(sig)
    # object addresses would make the page differ from run to run
    return re.sub(r" at 0x[0-9a-f]+", "", text)


def own_doc(obj) -> str | None:
    """The object's own docstring, cleaned; not one inherited from a base class (nn.Module's)."""
    doc = vars(obj).get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    return inspect.cleandoc(doc) if isinstance(doc, str) and doc.strip() else None


def text_block(doc: str | None) -> list[str]:
    if not doc:
        return ["(no docstring)", ""]
    return ["```text", *doc.rstrip().split("\n"), "```", ""]


def own_methods(cls) -> list[tuple[str, object]]:
    """Public methods, properties and class/static methods defined in cls itself, in order."""
    out = []
    for name, value in vars(cls).items():
        if name.startswith("_") and name != "__call__":
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if inspect.isfunction(value) or isinstance(value, property):
            out.append((name, value))
    return out


def document(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    lines = [f"## `{module_name}`", "", *text_block(own_doc(module))]
    for name in getattr(module, "__all__", []):
        obj = getattr(module, name)
        if inspect.ismodule(obj):
            continue
        qualified = f"{module_name}.{name}"
        if inspect.isclass(obj):
            lines += [f"### class `{qualified}{signature(obj)}`", ""]
            lines += text_block(own_doc(obj))
            for method, value in own_methods(obj):
                if isinstance(value, property):
                    lines += [f"#### property `{name}.{method}`", ""]
                else:
                    lines += [f"#### `{name}.{method}{signature(value)}`", ""]
                doc = own_doc(value)
                lines += text_block(doc) if doc else []
        elif callable(obj):
            lines += [f"### `{qualified}{signature(obj)}`", ""]
            lines += text_block(own_doc(obj))
        else:
            kind = type(obj).__name__
            size = f" of {len(obj)} entries" if hasattr(obj, "__len__") else ""
            lines += [f"### `{qualified}` ({kind}{size})", ""]
    return lines


def render() -> str:
    names = modules()
    lines = [
        "# posenc's Python API: reference",
        "",
        "Generated from the package's docstrings by `tools/gen_python_reference.py`; do not edit",
        "by hand (edit the docstring, then run the command below;",
        "`tests/python/test_python_reference.py` fails while this page is not current):",
        "",
        "```bash",
        COMMAND,
        "```",
        "",
        "How-to, with one runnable example per task: [python.md](python.md).",
        "",
        "Modules: " + ", ".join(f"`{m}`" for m in names) + ".",
        "",
    ]
    for name in names:
        lines += document(name)
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is not current")
    args = parser.parse_args()
    text = render()
    if args.check:
        current = open(OUT, encoding="utf-8").read() if os.path.exists(OUT) else ""
        if current != text:
            print(f"{os.path.relpath(OUT, ROOT)} is not current; regenerate it: {COMMAND}")
            return 1
        print(f"{os.path.relpath(OUT, ROOT)} is current")
        return 0
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {os.path.relpath(OUT, ROOT)} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
