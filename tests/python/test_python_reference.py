"""docs/python_reference.md is what the package's docstrings say now.

The page is generated from the docstrings by tools/gen_python_reference.py (module docstrings, then
each public name's signature and docstring); a docstring edited without regenerating the page, or
a new public name, fails here with the command that regenerates it.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import gen_python_reference  # noqa: E402


def test_the_reference_page_is_current():
    with open(gen_python_reference.OUT, encoding="utf-8") as f:
        current = f.read()
    want = gen_python_reference.render()
    assert current == want, (
        f"docs/python_reference.md is not current; regenerate it: {gen_python_reference.COMMAND}"
    )


def test_every_public_name_has_a_docstring():
    import importlib
    import inspect

    missing = []
    for module_name in gen_python_reference.modules():
        module = importlib.import_module(module_name)
        if not gen_python_reference.own_doc(module):
            missing.append(module_name)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if (
                inspect.isclass(obj) or inspect.isfunction(obj)
            ) and not gen_python_reference.own_doc(obj):
                missing.append(f"{module_name}.{name}")
    assert not missing, f"public names without a docstring: {missing}"
