"""posenc's diffusers rotary modules against the tables diffusers' own modules computed, as
committed in tests/fixtures/diffusers_tables.json by tools/gen_diffusers_fixtures.py (cases in
tools/diffusers_cases.py; the live comparison is tests/python/test_diffusers_patch.py).

Each recorded case is rebuilt (diffusers' module, for its settings), turned into posenc's module by
its family's `replace` as patch() does, and run on the case's inputs. The float64 families' tables
(float64 angles and cos/sin rounded once to float32) must equal the fixture to the bit on every
CPU; the float32 ones to the bit at the ATen capability the fixture records (AVX2) and within
diffusers_cases.FLOAT32_ATOL elsewhere (torch's vectorized float32 pow/cos/sin differ by CPU).

Regenerate: ATEN_CPU_CAPABILITY=avx2 PYTHONPATH=python ~/.cache/posenc/venv/bin/python
tools/gen_diffusers_fixtures.py
"""

import json
import os
import sys

import pytest
import torch

pytest.importorskip("diffusers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import diffusers_cases  # noqa: E402
import posenc.integrations.diffusers as pd  # noqa: E402

with open(os.path.join(ROOT, "tests", "fixtures", "diffusers_tables.json"), encoding="utf-8") as f:
    FIXTURE = json.load(f)
CAPABILITY = FIXTURE["generator"]["aten_cpu_capability"]
ROWS = [
    (family, case["name"])
    for family, entry in FIXTURE["families"].items()
    for case in entry["cases"]
]


def _families():
    return {f.name: f for f in pd._load_families().FAMILIES}


def test_every_case_is_recorded():
    """Every case of tools/diffusers_cases.py names a registered family and has its tables in the
    fixture (regenerated with it)."""
    assert set(diffusers_cases.CASES) <= set(_families())
    recorded = {(f, c.name) for f, entry in diffusers_cases.CASES.items() for c in entry.cases}
    assert recorded == set(ROWS), "regenerate tests/fixtures/diffusers_tables.json"
    for entry in FIXTURE["families"].values():
        assert entry["verdict"].startswith("equal to the bit"), entry["verdict"]


@pytest.mark.parametrize("family,case_name", ROWS)
def test_posenc_tables_equal_the_committed_ones(family, case_name):
    entry = FIXTURE["families"][family]
    recorded = next(c for c in entry["cases"] if c["name"] == case_name)
    case = next(c for c in diffusers_cases.CASES[family].cases if c.name == case_name)
    ours_module = _families()[family].replace(case.build())
    out = ours_module(*case.inputs())
    cos, sin = case.tables(out) if case.tables is not None else out
    exact = entry["float64"] or torch.backends.cpu.get_cpu_capability() == CAPABILITY
    for name, got in (("cos", cos), ("sin", sin)):
        assert list(got.shape) == recorded["shape"]
        assert str(got.dtype).replace("torch.", "") == recorded["dtype"]
        want = torch.tensor(recorded[name], dtype=torch.float64).reshape(recorded["shape"])
        got = got.double()
        if exact:
            assert torch.equal(got, want), (
                f"{family}/{case_name} {name}: max |d| {(got - want).abs().max().item()}"
            )
        else:
            torch.testing.assert_close(got, want, rtol=0, atol=diffusers_cases.FLOAT32_ATOL)


def test_check_names_the_families_whose_tables_changed():
    """gen_diffusers_fixtures --check's comparison: a value, a shape or a case that changed names
    its family; float32 families at another capability are compared within FLOAT32_ATOL."""
    import copy

    import gen_diffusers_fixtures as gen

    assert gen.changed_families(FIXTURE, FIXTURE) == {}
    fresh = copy.deepcopy(FIXTURE)
    fresh["families"]["wan"]["cases"][0]["cos"][5] += 2.0**-30  # one float64-rounded value
    fresh["families"]["flux"]["cases"][1]["shape"] = [1, 2]
    fresh["families"]["flux2"]["cases"].append(
        dict(fresh["families"]["flux2"]["cases"][0], name="a_new_case")
    )
    changed = gen.changed_families(FIXTURE, fresh)
    assert set(changed) == {"wan", "flux", "flux2"}
    assert "cos" in changed["wan"][0] and "new case" in changed["flux2"][0]
    other_cpu = copy.deepcopy(FIXTURE)
    other_cpu["generator"]["aten_cpu_capability"] = "AVX512"
    float32_family = next(n for n, e in FIXTURE["families"].items() if not e["float64"])
    other_cpu["families"][float32_family]["cases"][0]["sin"][0] += 1e-7  # an ulp apart
    assert gen.changed_families(FIXTURE, other_cpu) == {}
    other_cpu["families"][float32_family]["cases"][0]["sin"][0] += 1e-3
    assert set(gen.changed_families(FIXTURE, other_cpu)) == {float32_family}
