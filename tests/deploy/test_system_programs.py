"""`make test` on a fresh machine: scripts/install-system-programs.sh installs the system programs
the suite starts (redis-server, prometheus, tmux, npm, chromium) with apt-get where missing, or
names them in one line; the Makefile's test target runs it before pytest.

The script runs with PATH holding only shims (`id`, `sudo`, `apt-get`, and the programs a case
has), so what it finds and what it asks apt-get for are exactly what each case decides."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install-system-programs.sh"
ALL = ("redis-server", "prometheus", "tmux", "npm", "chromium")


def _shim(folder: Path, name: str, body: str = "exit 0") -> None:
    path = folder / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)


def _run(tmp_path: Path, present: tuple[str, ...], uid: int, sudo: bool, *args: str
         ) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    shims = tmp_path / "bin"
    shims.mkdir()
    log = tmp_path / "apt.log"
    _shim(shims, "id", f"echo {uid}")
    _shim(shims, "apt-get", f'echo "$*" >> {log}')
    if sudo:
        _shim(shims, "sudo", '[ "$1" = "-n" ] && [ "$2" = "true" ] && exit 0; "$@"')
    for name in present:
        _shim(shims, name)
    done = subprocess.run(["/bin/bash", str(SCRIPT), *args], env={"PATH": str(shims)},
                          capture_output=True, text=True, timeout=30)
    calls = log.read_text().splitlines() if log.exists() else []
    return done, calls


def test_nothing_happens_when_every_program_is_present(tmp_path: Path) -> None:
    done, calls = _run(tmp_path, ALL, uid=1000, sudo=False)
    assert done.returncode == 0, done.stderr
    assert calls == [] and done.stderr == ""


@pytest.mark.parametrize("uid, sudo", [(0, False), (1000, True)], ids=["root", "sudo"])
def test_missing_programs_are_installed_with_apt(tmp_path: Path, uid: int, sudo: bool) -> None:
    done, calls = _run(tmp_path, ("npm", "tmux", "chromium-browser"), uid=uid, sudo=sudo)
    assert done.returncode == 0, done.stderr
    assert calls == ["update -qq", "install -y -qq redis-server prometheus"]


def test_without_root_or_sudo_it_says_what_to_install_in_one_line(tmp_path: Path) -> None:
    done, calls = _run(tmp_path, ("npm",), uid=1000, sudo=False)
    assert done.returncode != 0 and calls == []
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "redis-server prometheus tmux chromium" in lines[0] and "apt-get install" in lines[0]


def test_asking_for_one_package_checks_only_that_one(tmp_path: Path) -> None:
    done, calls = _run(tmp_path, (), 0, False, "npm")
    assert done.returncode == 0, done.stderr
    assert calls == ["update -qq", "install -y -qq npm"]


def test_make_test_installs_system_programs_before_pytest() -> None:
    plan = subprocess.run(["make", "-n", "-B", "test"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=True).stdout.splitlines()
    script = next(i for i, line in enumerate(plan)
                  if line.endswith("scripts/install-system-programs.sh"))
    pytest_line = next(i for i, line in enumerate(plan) if " -m pytest" in line)
    assert script < pytest_line
    ci = (ROOT / ".ci" / "run").read_text()
    assert "apt-get" not in ci and ci.rstrip().endswith("make test")
