"""docker/Dockerfile.*: hadolint-clean, every COPY source in the build context, real `helios serve`
entrypoints as a non-root user, the images' dependency lists, and the demo core the CPU profile
serves built by the Dockerfile's own commands."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from tests.deploy import dockerfiles, topology
from tests.deploy.localrun import _blocker, left_out_modules
from tests.deploy.tools import REPO, hadolint

DOCKERFILES = sorted(dockerfiles.DOCKER_DIR.glob("Dockerfile.*"))
SERVICE_TARGETS = [(s, None) for s in dockerfiles.SERVICES] + [("engine", "engine-cpu")]


def test_one_dockerfile_per_service():
    assert [p.name for p in DOCKERFILES] == sorted(f"Dockerfile.{s}" for s in dockerfiles.SERVICES)


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint(path):
    result = hadolint(path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_copy_sources_are_in_the_build_context(path):
    ignore = dockerfiles.DockerIgnore.load(REPO / ".dockerignore")
    stages = dockerfiles.parse(path)
    for index, stage in enumerate(stages):
        earlier = {s.name for s in stages[:index]}
        for copy in stage.copies:
            if copy.from_stage is not None:
                assert copy.from_stage in earlier, f"{path.name}:{copy.line} {copy.from_stage}"
                continue
            for source in copy.sources:
                matches = dockerfiles.glob_sources(REPO, source)
                assert matches, f"{path.name}:{copy.line}: {source} does not exist"
                for match in matches:
                    sent = ignore.sent_files(REPO, str(match.relative_to(REPO)))
                    assert sent, f"{path.name}:{copy.line}: .dockerignore leaves out {source}"


def test_images_copy_every_installed_package():
    """`pip install .` in the image installs what pyproject's package list names: each top-level
    package must be copied in (and its generated stubs are produced in the image, not copied)."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    includes = config["tool"]["setuptools"]["packages"]["find"]["include"]
    tops = {pattern.rstrip("*").rstrip(".") for pattern in includes}
    for path in DOCKERFILES:
        for stage in dockerfiles.parse(path):
            if not any("pip install --no-deps ." in run for run in stage.runs):
                continue
            copied = {s for c in stage.copies if c.from_stage is None for s in c.sources}
            assert tops | {"pyproject.toml", "README.md", "proto"} <= copied, (path.name, stage.name)
            assert any("services.common.protogen" in run for run in stage.runs)
    ignore = dockerfiles.DockerIgnore.load(REPO / ".dockerignore")
    assert ignore.excluded("services/common/pb/engine_pb2.py"), "stubs are generated in the image"
    assert ignore.excluded(".venv/bin/python") and ignore.excluded(".git/HEAD")


@pytest.mark.parametrize("service, target", SERVICE_TARGETS)
def test_service_images(service, target):
    path = dockerfiles.dockerfile_of(service)
    stage = dockerfiles.stage(path, target)
    name, env = topology.image_service(path, target)
    assert name == service
    assert stage.entrypoint[:2] == ("tini", "--"), "signals reach helios; children are reaped"
    assert stage.user is not None, "the image sets USER"
    uid = stage.user.split(":")[0]
    assert uid.isdigit() and int(uid) >= 1000, f"USER {stage.user}: numeric, not root"
    assert env["HELIOS_LOG_FORMAT"] == "json"
    listen = env.get("HELIOS_LISTEN") or f"{env['HELIOS_HOST']}:{env['HELIOS_PORT']}"
    assert listen == f"0.0.0.0:{topology.default_port(service)}"
    if service == "gateway":   # /metrics on its HTTP port
        assert stage.exposed == [topology.default_port(service)]
        assert "HELIOS_METRICS_LISTEN" not in env
    else:                      # gRPC, then Prometheus /metrics on the fixed metrics port
        assert stage.exposed == [topology.default_port(service), topology.METRICS_PORT]
        assert env["HELIOS_METRICS_LISTEN"] == f"0.0.0.0:{topology.METRICS_PORT}"
    spec = topology.ServiceSpec(service, (), env)
    assert spec.unknown_settings() == []
    # the image's build runs the entrypoint once (`--help`), so a missing import fails the build
    build_runs = " ".join(run for s in dockerfiles.parse(path) for run in s.runs)
    assert f"helios serve {service} --help" in build_runs


def test_gpu_image_is_cuda_and_cpu_image_is_not():
    engine = dockerfiles.parse(dockerfiles.dockerfile_of("engine"))
    bases = {s.name: s.base for s in engine}
    assert bases["cuda-runtime"] == "${CUDA_IMAGE}"
    assert bases["engine"] == "cuda-runtime" and bases["build-cuda"] == "cuda-runtime"
    assert engine[-1].name == "engine", "the default target is the GPU engine"
    text = dockerfiles.dockerfile_of("engine").read_text()
    assert re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:\S+", text, re.M)
    runs = {s.name: " ".join(s.runs) for s in engine}
    assert "TORCH_CUDA_INDEX" in runs["build-cuda"] and "TORCH_CPU_INDEX" in runs["build-cpu"]
    assert "gcc" in runs["cuda-runtime"] and "python3.12-dev" in runs["cuda-runtime"], \
        "Triton compiles its launcher stubs at run time"
    assert dockerfiles.stage(dockerfiles.dockerfile_of("engine")).env["HELIOS_DEVICE"] == "auto"


# ---- docker/requirements.py -------------------------------------------------------------------

def test_requirements_follow_pyproject():
    deps = dockerfiles.requirements_module()
    runtime = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert deps.requirements("engine") == runtime
    for image in ("gateway", "frontend"):
        names = {deps.requirement_name(line) for line in deps.requirements(image)}
        assert "torch" not in names and "cuda-python" not in names
        assert len(names) == len(runtime) - 2
    assert "torch" in {deps.requirement_name(x) for x in deps.requirements("imageprep")}
    assert any(line.startswith("grpcio-tools") for line in deps.requirements("build"))
    for path in DOCKERFILES:
        service = path.name.split(".")[1]
        assert f"docker/requirements.py {service} >" in path.read_text()


def test_requirements_refuse_stale_names(tmp_path):
    deps = dockerfiles.requirements_module()
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["grpcio>=1"]\n')
    with pytest.raises(ValueError, match="torch"):
        deps.requirements("gateway", pyproject)
    with pytest.raises(KeyError):
        deps.requirements("dashboard")
    result = subprocess.run([sys.executable, str(dockerfiles.DOCKER_DIR / "requirements.py"),
                             "gateway"], capture_output=True, text=True, check=True)
    assert "fastapi" in result.stdout and "torch" not in result.stdout


def test_left_out_packages_are_unimportable(tmp_path):
    blocked = left_out_modules("gateway")
    assert {"torch", "cuda"} <= blocked and "numpy" not in blocked
    assert left_out_modules("imageprep") >= {"cuda"} and "torch" not in left_out_modules("imageprep")
    site = _blocker(tmp_path / "site", blocked)
    result = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(site)})
    assert result.returncode != 0 and "not installed in this image" in result.stderr


# ---- the demo core, built the way the image builds it -------------------------------------------

def test_demo_model_image_can_fill_an_empty_volume():
    stage = dockerfiles.stage(dockerfiles.dockerfile_of("engine"), "demo-model")
    assert stage.user == "10001:10001"
    assert any("chown 10001:10001 /target" in run for run in stage.runs), \
        "a fresh compose volume at /target must be writable by the image's user"
    assert stage.entrypoint[-1].endswith("/target/")


def _demo_commands() -> tuple[str, list[str]]:
    stages = {s.name: s for s in dockerfiles.parse(dockerfiles.dockerfile_of("engine"))}
    build = next(run for run in stages["demo-build"].runs if "demo-model" in run)
    return build, list(stages["demo-model"].entrypoint)


@pytest.mark.slow
def test_demo_model_image_commands(tmp_path, demo_core):
    """Run the demo-build stage's commands and the demo-model entrypoint with their paths
    mapped here: the copied core equals `helios run --demo`'s, and opens."""
    from services.common.core import MANIFEST_NAME, open_model

    build, entrypoint = _demo_commands()
    helios = f"{shlex.quote(sys.executable)} -m services.cli.main"
    # Map the image's paths first, then insert this interpreter (whose path may itself be
    # under /tmp, as in a CI clone).
    command = build.replace("/tmp/", f"{tmp_path}/tmp/") \
        .replace("/models", f"{tmp_path}/image-models") \
        .replace("/opt/helios/bin/helios", helios)
    result = subprocess.run(["sh", "-c", command], cwd=REPO, capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    target = tmp_path / "volume"
    target.mkdir()
    (target / "helios-demo").mkdir()
    (target / "helios-demo" / "stale-file").write_text("from an older image")
    copy = [arg.replace("/target", str(target)).replace("/models", f"{tmp_path}/image-models")
            for arg in entrypoint]
    subprocess.run(copy, check=True, timeout=60)
    copied = target / "helios-demo"
    assert not (copied / "stale-file").exists(), "a newer image replaces the old core"
    built = json.loads((copied / MANIFEST_NAME).read_text())
    reference = json.loads((Path(demo_core) / MANIFEST_NAME).read_text())
    for key in ("identity", "model_id", "served_names", "architecture", "context_hint",
                "capacity_hint"):
        assert built[key] == reference[key], key
    assert open_model(copied).manifest.identity == reference["identity"]


# ---- the build recipe itself ---------------------------------------------------------------------

def _context_copy(stage: dockerfiles.Stage, destination: Path) -> None:
    """Copy what the stage's COPY instructions take from the build context, as `docker build`
    sees it (through .dockerignore)."""
    import shutil

    ignore = dockerfiles.DockerIgnore.load(REPO / ".dockerignore")
    for copy in stage.copies:
        if copy.from_stage is not None:
            continue
        for source in copy.sources:
            for relative in ignore.sent_files(REPO, source):
                target = destination / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / relative, target)


@pytest.mark.slow
def test_build_recipe_installs_working_services(tmp_path):
    """Replay the gateway image's build steps on its build context: generate the stubs, build
    and install the package without the source tree, then every service's entrypoint runs from
    the installed copy alone."""
    stage = next(s for s in dockerfiles.parse(dockerfiles.dockerfile_of("gateway"))
                 if s.name == "build")
    context = tmp_path / "context"
    _context_copy(stage, context)
    assert not (context / "services" / "common" / "pb").exists(), "stubs are not copied in"
    subprocess.run([sys.executable, "-m", "services.common.protogen"], cwd=context, check=True,
                   capture_output=True, timeout=120)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "wheel"), str(context)], check=True,
                   capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "wheel").glob("helios-*.whl")
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(site), str(wheel)], check=True, capture_output=True, timeout=300)
    assert (site / "services" / "common" / "pb" / "engine_pb2_grpc.py").is_file()
    assert not (site / "tests").exists() and not (site / "proto").exists()
    env = {**os.environ, "PYTHONPATH": str(site)}
    # one interpreter: every service's server module imports from the installed copy alone
    probe = textwrap.dedent("""\
        import importlib, sys
        from services.cli.main import SERVICES
        for name, module in sorted(SERVICES.items()):
            loaded = importlib.import_module(module)
            print(name, loaded.__file__)
        """)
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    located = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert set(located) == set(dockerfiles.SERVICES)
    assert all(path.startswith(str(site)) for path in located.values()), located
    result = subprocess.run([sys.executable, "-m", "services.cli.main", "serve", "gateway",
                             "--help"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and "helios serve gateway" in result.stdout, result.stderr
