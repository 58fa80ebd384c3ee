"""Configs reaching the C++ library from Python meet the tool's limits (posenc/config/
config_reader.h: size 4194304 bytes, depth 64 levels, 1000000 values once YAML aliases expand),
each refused in one line naming the limit and its number; and a second copy of the operator
library loaded after `import posenc` is one line, not an abort.

Reproducers of crashes, hangs and runaway memory run in a child process (a crash must not take
the test run with it; a hang meets the child's timeout).
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import yaml

import posenc
import posenc._library as library

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(library.__file__)))


def _run_child(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, POSENC_OPS_LIBRARY=library.library_path(), PYTHONPATH=PYTHON_DIR)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _nested_compose(levels: int) -> dict:
    config = {"type": "rope"}
    for _ in range(levels):
        config = {"type": "compose", "encoders": [config]}
    return config


def _nested_compose_text(levels: int) -> str:
    return '{"type": "compose", "encoders": [' * levels + '{"type": "rope"}' + "]}" * levels


# A 342-byte "billion laughs": nine levels of nine aliases, 387 million strings once expanded.
def _alias_bomb() -> str:
    text = 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
    for previous, name in zip("abcdefgh", "bcdefghi"):
        text += f"{name}: &{name} [" + ", ".join([f"*{previous}"] * 9) + "]\n"
    return text


def test_a_compose_nested_50000_deep_is_one_line_not_a_segfault():
    # 1.7 MB of JSON text: building it recursed once per level and overflowed the stack.
    r = _run_child("""
        import torch, posenc
        text = '{"type": "compose", "encoders": [' * 50000 + '{"type": "rope"}' + ']}' * 50000
        try:
            torch.classes.posenc.Encoder(text, 16, 2, 0)
        except RuntimeError as e:
            print(str(e))
        """)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.strip().splitlines() == [
        (
            "posenc.build_encoder config: nested 100001 levels deep; configs are limited to 64 levels "
            "(the config depth limit)"
        )
    ]


def test_a_compose_nested_5000_deep_is_refused_at_once_in_little_memory():
    # It took 9 s and 4.9 GB (each level copied the rest of the tree) before it was built.
    r = _run_child("""
        import json, resource, time, torch, posenc
        text = '{"type": "compose", "encoders": [' * 5000 + '{"type": "rope"}' + ']}' * 5000
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        try:
            torch.classes.posenc.Encoder(text, 16, 2, 0)
            error = None
        except RuntimeError as e:
            error = str(e)
        seconds = time.perf_counter() - start
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        print(json.dumps({"error": error, "seconds": seconds, "grown_mb": grown_mb}))
        """)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["error"] is not None and "(the config depth limit)" in out["error"], out
    assert "configs are limited to 64 levels" in out["error"], out
    assert out["seconds"] < 1.0 and out["grown_mb"] < 100, out


DOORS = {
    "torch.classes.posenc.Encoder": lambda c, tmp: torch.classes.posenc.Encoder(
        json.dumps(c), 16, 2, 0
    ),
    "posenc.Encoder(text)": lambda c, tmp: posenc.Encoder(json.dumps(c), dim=16, num_heads=2),
    "build_encoder(dict)": lambda c, tmp: posenc.build_encoder(c, dim=16, num_heads=2),
    "build_encoder(json text)": lambda c, tmp: posenc.build_encoder(
        json.dumps(c), dim=16, num_heads=2
    ),
    "build_encoder(.json)": lambda c, tmp: posenc.build_encoder(
        _write(tmp / "c.json", json.dumps(c)), dim=16, num_heads=2
    ),
    "build_encoder(.yaml)": lambda c, tmp: posenc.build_encoder(
        _write(tmp / "c.yaml", yaml.safe_dump(c)), dim=16, num_heads=2
    ),
}


def _write(path, text):
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("door", sorted(DOORS))
def test_every_python_door_has_the_tools_depth_limit(door, tmp_path):
    # 33 compose levels are 66 JSON levels: past the limit, and each door says so in one line.
    with pytest.raises(RuntimeError) as e:
        DOORS[door](_nested_compose(33), tmp_path)
    message = str(e.value)
    assert len(message.strip().splitlines()) == 1, message
    assert "64" in message and "(the config depth limit)" in message, message
    # 31 levels (62 JSON levels) are within it, through every door alike.
    DOORS[door](_nested_compose(31), tmp_path)


def test_a_yaml_alias_bomb_is_one_line_not_a_hang(tmp_path):
    # build_encoder("config.yaml") ran PyYAML, then json.dumps over the expanded document: it
    # never returned. The C++ library counts the values as the aliases expand.
    path = tmp_path / "config.yaml"
    path.write_text(_alias_bomb())
    r = _run_child(
        f"""
        import posenc, yaml
        for config in ({str(path)!r}, yaml.safe_load(open({str(path)!r}).read())):
            try:
                posenc.build_encoder(config)
            except RuntimeError as e:
                print(str(e))
        """,
        timeout=60,
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.strip().splitlines() == [
        (
            "posenc.build_encoder config: more than 1000000 values once aliases are expanded (the "
            "config size limit)"
        ),
        "posenc.build_encoder config: more than 1000000 values (the config size limit)",
    ]


def test_aliases_of_a_long_string_meet_the_size_limit():
    # 100 x 100 aliases of a 4000-byte string: 10^4 values, but 40 MB of text once expanded.
    text = (
        'type: rope\na: &a "'
        + "x" * 4000
        + '"\nb: &b ['
        + ", ".join(["*a"] * 100)
        + "]\nc: ["
        + ", ".join(["*b"] * 100)
        + "]\n"
    )
    with pytest.raises(
        RuntimeError,
        match=r"more than 4194304 bytes in its keys and strings once "
        r"aliases are expanded \(the config size limit\)",
    ):
        posenc.Encoder(text, dim=16, num_heads=2)
    with pytest.raises(
        RuntimeError,
        match=r"more than 4194304 bytes in its keys and strings \(the "
        r"config size limit\)",
    ):
        posenc.build_encoder({"type": "rope", "x": ["x" * 4000] * 2000}, dim=16, num_heads=2)


def test_a_dict_that_holds_itself_is_one_line():
    config = {"type": "compose"}
    config["encoders"] = [config]
    with pytest.raises(RuntimeError, match=r"nested deeper than 64 levels \(the config depth "):
        posenc.build_encoder(config, dim=16, num_heads=2)


def test_a_config_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "big.json"
    path.write_text('{"type": "rope", "x": "' + "y" * (5 << 20) + '"}')
    with pytest.raises(RuntimeError) as e:
        posenc.build_encoder(str(path), dim=16, num_heads=2)
    assert str(e.value) == (
        f"{path}: {path.stat().st_size} bytes; configs are limited to 4194304 "
        "bytes (the config size limit)"
    )


def test_yaml_text_is_read_by_the_cpp_library_and_given_back_as_the_config():
    enc = posenc.Encoder(
        "type: compose\nencoders:\n  - {type: rope, axes: [t]}\n  - type: alibi\n",
        dim=16,
        num_heads=2,
    )
    assert enc.type == "compose"
    assert enc.config == {
        "type": "compose",
        "encoders": [{"type": "rope", "axes": ["t"]}, {"type": "alibi"}],
    }
    assert enc(posenc.Positions.sequence(4)).parts == ["rope: rotary", "alibi: bias (alibi)"]


def test_a_second_copy_loaded_after_import_is_one_line_not_an_abort(tmp_path):
    # import posenc, then torch.ops.load_library of a copy: every operator was registered twice,
    # which aborted the interpreter (signal 6). The copy now registers none and says so once.
    lib = tmp_path / "libposenc_ops.so"
    shutil.copy(library.library_path(), lib)
    r = _run_child(f"""
        import torch, posenc
        torch.ops.load_library({str(lib)!r})
        enc = posenc.build_encoder({{"type": "rope"}}, dim=16, num_heads=2)
        q = torch.randn(1, 2, 4, 8)
        print(tuple(enc(posenc.Positions.sequence(4)).rotate(q, q)[0].shape))
        """)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.strip() == "(1, 2, 4, 8)"
    lines = [line for line in r.stderr.splitlines() if "posenc" in line]
    assert len(lines) == 1, r.stderr
    assert "posenc: its operators are already registered in this process" in lines[0]
    assert f"{lib} registers none of its own, and the first copy's stay in use" in lines[0]
