"""Print one Helios image's pip requirements, read from pyproject.toml (the only dependency list).

Every image installs the project's declared runtime dependencies except those its services
never import: the gateway and frontend images carry no torch and no CUDA bindings, imageprep
carries the CPU build of torch (its resize matches transformers' torch interpolation) but no CUDA
bindings, which keeps them small and quick to pull. `tests/deploy` starts each of those services with the
left-out packages made unimportable, so a service that starts needing one fails CI instead of a
deployment.

    python docker/requirements.py gateway          # runtime requirements of one image
    python docker/requirements.py build            # tools the image build needs (protoc)
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

# Distributions the services without a model on the GPU never import.
GPU_ONLY = ("torch", "cuda-python")


@dataclass(frozen=True)
class ImageDeps:
    """What one image installs: the runtime dependencies minus `without`, plus `extras`."""

    without: tuple[str, ...] = ()     # distribution names left out (normalized spelling)
    extras: tuple[str, ...] = ()      # optional-dependency groups added
    runtime: bool = True              # False: only the extras (build tools)


IMAGES: dict[str, ImageDeps] = {
    "gateway": ImageDeps(without=GPU_ONLY),
    "frontend": ImageDeps(without=GPU_ONLY),
    # torch (CPU wheels) is installed first by the Dockerfile, like the engine's.
    "imageprep": ImageDeps(without=("cuda-python",)),
    # torch is installed first from the CUDA or CPU wheel index the Dockerfile names; the
    # requirement line that follows is then already satisfied.
    "engine": ImageDeps(),
    "build": ImageDeps(extras=("build",), runtime=False),
}

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def normalize(name: str) -> str:
    """PEP 503 normalized distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(line: str) -> str:
    match = _NAME.match(line)
    if not match:
        raise ValueError(f"not a requirement: {line!r}")
    return normalize(match.group(1))


def requirements(image: str, pyproject: Path = PYPROJECT) -> list[str]:
    """The requirement lines for `image`; unknown images and stale `without` names raise."""
    if image not in IMAGES:
        raise KeyError(f"unknown image {image!r}; known: {', '.join(IMAGES)}")
    deps = IMAGES[image]
    project = tomllib.loads(pyproject.read_text())["project"]
    runtime = list(project.get("dependencies", []))
    declared = {requirement_name(line) for line in runtime}
    stale = {normalize(n) for n in deps.without} - declared
    if stale:
        raise ValueError(f"{image}: left-out packages not in pyproject.toml: {sorted(stale)}")
    lines = [line for line in runtime if requirement_name(line) not in
             {normalize(n) for n in deps.without}] if deps.runtime else []
    optional = project.get("optional-dependencies", {})
    for extra in deps.extras:
        if extra not in optional:
            raise ValueError(f"{image}: pyproject.toml has no extra {extra!r}")
        lines += optional[extra]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image", choices=sorted(IMAGES))
    args = parser.parse_args(argv)
    print("\n".join(requirements(args.image)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
