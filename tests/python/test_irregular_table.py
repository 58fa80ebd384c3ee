"""tools/irregular_table.py (the seed table of the irregular-sampling experiment,
scripts/irregular_experiment.sh) compares its variants like with like: runs written here as
`posenc compare` writes them (<variant>_s<seed>/summary.json, task forecast_packed); a variant
that lacks a seed another one has, or runs that trained a different number of steps (a stopped
run's summary beside finished ones), would be averaged over different runs without a word, so the
tool refuses them in one line naming the runs."""

import importlib.util
import json
import os

import pytest

_TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "irregular_table.py")


def _tool():
    spec = importlib.util.spec_from_file_location("irregular_table", _TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(folder, name, mae, steps=1000):
    os.makedirs(folder / name)
    rows = [{"setting": "largest gap >= 1", "x": 1, "metrics": {"mae": mae, "pairs": 40}}]
    summary = {
        "name": name,
        "steps": steps,
        "final": {"mae": mae, "mase": mae / 2, "mae_last": 3.0, "mase_last": 1.5},
        "generalization": rows,
    }
    (folder / name / "summary.json").write_text(json.dumps(summary))


def test_equal_seed_sets_give_the_tables(tmp_path):
    for seed in (0, 1):
        _run(tmp_path, f"patch_index_s{seed}", 2.0 + seed)
        _run(tmp_path, f"timestamp_s{seed}", 1.0 + seed)
    tool = _tool()
    runs = tool.load(str(tmp_path))
    text = tool.tables(runs, tool.order_of(str(tmp_path), runs))
    assert "| patch_index | 0, 1 | **2.500** ± 0.500 (2.000 / 3.000)" in text
    assert "| timestamp | 0, 1 | **1.500** ± 0.500 (1.000 / 2.000)" in text


def test_a_variant_without_a_seed_the_others_have_is_one_line(tmp_path):
    for seed in (0, 1, 2):
        _run(tmp_path, f"patch_index_s{seed}", 2.0)
    for seed in (0, 1):  # timestamp_s2 unfinished: its mean would be over seeds 0 and 1 only
        _run(tmp_path, f"timestamp_s{seed}", 1.0)
    with pytest.raises(ValueError) as info:
        _tool().load(str(tmp_path))
    message = str(info.value)
    assert "\n" not in message
    assert "seeds differ between variants" in message
    assert "patch_index: 0, 1, 2" in message and "timestamp: 0, 1" in message


def test_runs_of_different_lengths_are_one_line(tmp_path):
    for seed in (0, 1):
        _run(tmp_path, f"patch_index_s{seed}", 2.0)
        _run(tmp_path, f"timestamp_s{seed}", 1.0, steps=300 if seed else 1000)
    with pytest.raises(ValueError) as info:
        _tool().load(str(tmp_path))
    message = str(info.value)
    assert "\n" not in message
    assert "trained different numbers of steps" in message and "timestamp_s1: 300" in message
