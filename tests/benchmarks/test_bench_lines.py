"""benchmarks/gpu/*_benches.txt: the lines a device call runs (`BENCHES`, run_engine.sh reads
each as `name timeout command...` and runs the command with `bash -c`). A line that does not
parse, a timeout that is not a number, a name used twice, or a benchmark flag the script does
not have fails here, not in a lent GPU's time."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "benchmarks" / "gpu").glob("*_benches.txt"))


def lines(path: Path) -> list[tuple[str, str, str]]:
    out = []
    for raw in path.read_text().splitlines():
        if raw.strip():
            name, limit, command = raw.split(maxsplit=2)
            out.append((name, limit, command))
    return out


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_each_line_parses(path: Path) -> None:
    seen: set[str] = set()
    for name, limit, command in lines(path):
        assert re.fullmatch(r"[a-z0-9_]+", name), name
        assert name not in seen, f"{path.name}: {name} twice"
        seen.add(name)
        assert limit.isdigit() and 0 < int(limit) <= 600, (name, limit)
        done = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
        assert done.returncode == 0, f"{name}: {done.stderr}"


def _flags(script: Path) -> set[str]:
    """The flags a script's argparse declares, its own and those of the benchmarks modules it
    imports (stacks.py's shared stack flags, say)."""
    text = script.read_text()
    flags = set(re.findall(r"add_argument\(\s*\"(--[a-z0-9-]+)\"", text))
    for module in re.findall(r"(?:from benchmarks\.|from |import )(\w+) import|import (\w+)", text):
        for name in module:
            shared = ROOT / "benchmarks" / f"{name}.py"
            if name and shared.is_file() and shared != script:
                flags |= set(re.findall(r"add_argument\(\s*\"(--[a-z0-9-]+)\"",
                                        shared.read_text()))
    return flags


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_benchmark_flags_exist(path: Path) -> None:
    """Every `--flag` given to a benchmarks/*.py script is one its argparse declares."""
    for name, _, command in lines(path):
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
        for i, word in enumerate(tokens):
            if not (word.startswith("benchmarks/") and word.endswith(".py")):
                continue
            script = ROOT / word
            assert script.is_file(), f"{name}: {word} does not exist"
            declared = _flags(script)
            for flag in tokens[i + 1:]:
                if flag in ("do", "done") or set(flag) <= set(";&|<>()"):
                    break                       # the end of this command
                if flag.startswith("--") and "=" not in flag:
                    assert flag in declared, f"{name}: {word} has no {flag}"
