"""Read docker/Dockerfile.* with BuildKit's own parser (the `dockerfile` package) into stages.

A `Stage` is what one build target produces: its base, the ENV it accumulated (stages built
FROM an earlier stage inherit that stage's ENV, USER and ENTRYPOINT), its USER, EXPOSE ports,
ENTRYPOINT and the COPY instructions it runs.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path

import dockerfile

REPO = Path(__file__).resolve().parents[2]
DOCKER_DIR = REPO / "docker"
SERVICES = ("gateway", "frontend", "imageprep", "engine")


@dataclass(frozen=True)
class Copy:
    sources: tuple[str, ...]
    destination: str
    from_stage: str | None          # --from=STAGE (None: the build context)
    line: int


@dataclass
class Stage:
    name: str
    base: str
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    exposed: list[int] = field(default_factory=list)
    entrypoint: tuple[str, ...] = ()
    copies: list[Copy] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)


def _pairs(values: tuple[str, ...]) -> dict[str, str]:
    return dict(zip(values[::2], values[1::2], strict=True))


def parse(path: Path) -> list[Stage]:
    """The stages of one Dockerfile in order (the last is the default target)."""
    stages: list[Stage] = []
    for command in dockerfile.parse_file(str(path)):
        if command.cmd == "FROM":
            base = command.value[0]
            name = command.value[2] if len(command.value) == 3 else str(len(stages))
            parent = next((s for s in stages if s.name == base), None)
            stage = Stage(name=name, base=base)
            if parent is not None:
                stage.env = dict(parent.env)
                stage.user = parent.user
                stage.entrypoint = parent.entrypoint
            stages.append(stage)
            continue
        if not stages:
            continue  # global ARGs
        stage = stages[-1]
        if command.cmd == "ENV":
            stage.env.update(_pairs(command.value))
        elif command.cmd == "USER":
            stage.user = command.value[0]
        elif command.cmd == "EXPOSE":
            stage.exposed += [int(v.split("/")[0]) for v in command.value]
        elif command.cmd == "ENTRYPOINT":
            stage.entrypoint = tuple(command.value) if command.json else ("sh", "-c", *command.value)
        elif command.cmd in ("COPY", "ADD"):
            from_stage = next((f.split("=", 1)[1] for f in command.flags
                               if f.startswith("--from=")), None)
            stage.copies.append(Copy(tuple(command.value[:-1]), command.value[-1], from_stage,
                                     command.start_line))
        elif command.cmd == "RUN":
            stage.runs.append(" ".join(command.value))
    return stages


def stage(path: Path, target: str | None = None) -> Stage:
    stages = parse(path)
    if target is None:
        return stages[-1]
    return next(s for s in stages if s.name == target)


def dockerfile_of(service: str) -> Path:
    return DOCKER_DIR / f"Dockerfile.{service}"


# ---- .dockerignore: Docker's rules (last matching pattern wins, `!` re-includes) -----------------

def _pattern_regex(pattern: str) -> re.Pattern[str]:
    parts = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            parts.append(".*")
            i += 2
            if pattern.startswith("/", i):
                parts[-1] = "(?:.*/)?"
                i += 1
            continue
        char = pattern[i]
        parts.append("[^/]*" if char == "*" else "[^/]" if char == "?" else re.escape(char))
        i += 1
    return re.compile("".join(parts) + "$")


@dataclass(frozen=True)
class DockerIgnore:
    rules: tuple[tuple[bool, re.Pattern[str]], ...]   # (is_exception, pattern)

    @classmethod
    def load(cls, path: Path) -> DockerIgnore:
        rules = []
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            exception = line.startswith("!")
            pattern = line.lstrip("!").strip().strip("/")
            rules.append((exception, _pattern_regex(pattern)))
        return cls(tuple(rules))

    def excluded(self, relative: str) -> bool:
        """True when `relative` (or a directory above it) is left out of the build context."""
        parts = relative.strip("/").split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        verdict = False
        for exception, pattern in self.rules:
            if any(pattern.match(p) for p in prefixes):
                verdict = not exception
        return verdict

    def sent_files(self, root: Path, relative: str) -> list[str]:
        """Files under `relative` that reach the build context."""
        base = root / relative
        files = [base] if base.is_file() else [p for p in base.rglob("*") if p.is_file()]
        return [str(p.relative_to(root)) for p in files
                if not self.excluded(str(p.relative_to(root)))]


def glob_sources(root: Path, source: str) -> list[Path]:
    if any(ch in source for ch in "*?["):
        return [p for p in root.glob(source) if fnmatch.fnmatch(str(p.relative_to(root)), source)]
    path = root / source
    return [path] if path.exists() else []


def requirements_module():
    """docker/requirements.py (the images' dependency lists), imported from its path."""
    import importlib.util
    import sys

    name = "docker_requirements"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, DOCKER_DIR / "requirements.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
