"""Generate the Python gRPC stubs from `proto/helios/v1/*.proto` and prove they have not drifted.

The stubs live in `services/common/pb/` (git-ignored). They are written by `make proto` (part of
`make install`), never by hand. Generation rewrites protoc's absolute imports
(`from helios.v1 import common_pb2`) into package-relative ones so the stubs need no path hacks,
and stamps `pb/__init__.py` with a SHA-256 over the .proto sources; importing a stale package
fails loudly (see `pb/__init__.py`), and `check()` regenerates into a temporary directory and
compares every byte.

    python -m services.common.protogen            # generate
    python -m services.common.protogen --check    # exit 1 if the stubs differ from the sources
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO_ROOT / "proto"
PROTO_PACKAGE = "helios/v1"
STUB_DIR = Path(__file__).resolve().parent / "pb"

_ABSOLUTE_IMPORT = re.compile(r"^from helios\.v1 import ", re.MULTILINE)

_INIT_TEMPLATE = '''"""Generated gRPC stubs for proto/helios/v1. Do not edit: run `make proto`.

Only servicer and client modules import these (STYLE.md: protobuf stays at the edges).
"""

PROTO_FINGERPRINT = "{fingerprint}"


def _check_fresh() -> None:
    # Refuse to run with stubs generated from other .proto sources than the ones beside them.
    from services.common.protogen import proto_fingerprint, PROTO_ROOT

    if PROTO_ROOT.is_dir():
        current = proto_fingerprint()
        if current != PROTO_FINGERPRINT:
            raise ImportError(
                "services/common/pb is stale: the .proto files changed since the stubs were "
                "generated; run `make proto`"
            )


_check_fresh()
'''


def proto_files(root: Path = PROTO_ROOT) -> list[Path]:
    return sorted((root / PROTO_PACKAGE).glob("*.proto"))


def proto_fingerprint(root: Path = PROTO_ROOT) -> str:
    """SHA-256 over every .proto file's name and bytes, in sorted order."""
    digest = hashlib.sha256()
    for path in proto_files(root):
        digest.update(path.name.encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def _run_protoc(out_dir: Path) -> None:
    from grpc_tools import protoc  # build-time dependency (extra `build`)

    include = Path(protoc.__file__).resolve().parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p) for p in proto_files()],
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")


def render(out_dir: Path) -> None:
    """Write the complete stub package (flat modules + stamped __init__) into `out_dir`."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp)
        _run_protoc(raw)
        out_dir.mkdir(parents=True, exist_ok=True)
        for generated in sorted((raw / PROTO_PACKAGE).iterdir()):
            text = _ABSOLUTE_IMPORT.sub("from . import ", generated.read_text())
            (out_dir / generated.name).write_text(text)
    (out_dir / "__init__.py").write_text(_INIT_TEMPLATE.format(fingerprint=proto_fingerprint()))


def generate(stub_dir: Path = STUB_DIR) -> None:
    staging = stub_dir.with_name(stub_dir.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    render(staging)
    shutil.rmtree(stub_dir, ignore_errors=True)
    staging.rename(stub_dir)


def differences(stub_dir: Path = STUB_DIR) -> list[str]:
    """Names of stub files that differ from a fresh generation (empty list: in sync)."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "pb"
        render(fresh)
        wanted = {p.name: p.read_bytes() for p in fresh.iterdir() if p.is_file()}
    have = (
        {p.name: p.read_bytes() for p in stub_dir.iterdir() if p.is_file()}
        if stub_dir.is_dir()
        else {}
    )
    names = sorted(set(wanted) | set(have))
    return [name for name in names if wanted.get(name) != have.get(name)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    if args.check:
        diff = differences()
        if diff:
            print(f"stubs differ from proto/ sources: {', '.join(diff)}; run `make proto`")
            return 1
        print("stubs match proto/ sources")
        return 0
    generate()
    print(f"generated {STUB_DIR.relative_to(REPO_ROOT)} from {len(proto_files())} .proto files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
