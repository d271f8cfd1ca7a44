"""Start a deployment's topology as local processes, with exactly its settings.

Each service runs `helios serve NAME` with the HELIOS_* variables and arguments its container
would get; only what names the container world is rewritten for loopback: `host:port` of a
service -> 127.0.0.1:<free port>, `0.0.0.0:<port>` listen addresses -> 127.0.0.1:<its port>
(HELIOS_METRICS_LISTEN -> 127.0.0.1:<its own metrics port>), `/models/...` -> a local
directory, `redis://<service>:6379/<db>` -> a real local redis-server.
Packages an image leaves out (docker/requirements.py) are made unimportable in that service's
process, so a service that starts importing one fails here instead of in its container.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import re
import sys
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement

from tests.deploy.dockerfiles import requirements_module
from tests.deploy.topology import Topology
from tests.support.processes import ServiceProcess, free_port

START_ORDER = ("imageprep", "engine", "frontend", "gateway")
_HOSTPORT = re.compile(r"^(?P<host>[A-Za-z0-9._-]+):(?P<port>\d+)$")
_REDIS = re.compile(r"^redis://(?P<host>[A-Za-z0-9._-]+):(?P<port>\d+)(?P<db>/\d+)?$")


def _dist_closure(names: set[str]) -> set[str]:
    """Installed distributions these names need, themselves included (normalized names)."""
    seen: set[str] = set()
    pending = [n.lower().replace("_", "-") for n in names]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        seen.add(name)
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
                continue
            pending.append(requirement.name.lower().replace("_", "-"))
    return seen


def left_out_modules(image: str) -> set[str]:
    """Top-level modules an image does not install: the left-out distributions and whatever
    only they need."""
    deps = requirements_module()
    kept = {deps.requirement_name(line) for line in deps.requirements(image)}
    dropped = _dist_closure(set(deps.IMAGES[image].without)) - _dist_closure(kept)
    modules = set()
    for module, dists in importlib.metadata.packages_distributions().items():
        if any(d.lower().replace("_", "-") in dropped for d in dists):
            modules.add(module)
    return modules


def _blocker(directory: Path, modules: set[str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(textwrap.dedent(f"""\
        # Written by tests/deploy: these modules are not installed in this service's image.
        import sys

        _LEFT_OUT = {sorted(modules)!r}

        class _NotInImage:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in _LEFT_OUT:
                    raise ModuleNotFoundError(
                        f"No module named {{name!r}} (not installed in this image)", name=name)
                return None

        sys.meta_path.insert(0, _NotInImage())
        """))
    return directory


@dataclass
class LocalDeployment:
    topology: Topology
    ports: dict[str, int]
    metrics_ports: dict[str, int]       # gRPC services: where HELIOS_METRICS_LISTEN serves here
    env: dict[str, dict[str, str]]
    argv: dict[str, list[str]]
    processes: dict[str, ServiceProcess] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports['gateway']}"

    def output(self) -> str:
        return "\n".join(f"--- {n}\n{p.output()[-3000:]}" for n, p in self.processes.items())


def _rewrite(value: str, service: str, topology: Topology, ports: Mapping[str, int],
             models_dir: Path, redis_url: str | None) -> str:
    if value.startswith("0.0.0.0:"):
        return f"127.0.0.1:{ports[service]}"
    match = _HOSTPORT.match(value)
    if match and match["host"] in topology.hosts:
        return f"127.0.0.1:{ports[topology.hosts[match['host']]]}"
    match = _REDIS.match(value)
    if match:
        if redis_url is None:
            raise AssertionError(f"{service} uses Redis ({value}) but the test started none")
        return re.sub(r"/\d+$", "", redis_url) + (match["db"] or "")
    if value.startswith("/models/"):
        return str(models_dir / value.removeprefix("/models/"))
    return value


@contextlib.contextmanager
def run_locally(topology: Topology, workdir: Path, *, models_dir: Path,
                redis_url: str | None = None,
                images: Mapping[str, str] | None = None) -> Iterator[LocalDeployment]:
    """Start every service of `topology` (imageprep, engine, frontend, gateway) and yield once
    all are started; `images` names each service's image for the left-out-package check."""
    ports = {name: free_port() for name in topology.services}
    metrics_ports = {name: free_port() for name, spec in topology.services.items()
                     if spec.env.get("HELIOS_METRICS_LISTEN")}
    deployment = LocalDeployment(topology, ports, metrics_ports, {}, {})
    for name, spec in topology.services.items():
        env = {k: _rewrite(v, name, topology, ports, models_dir, redis_url)
               for k, v in spec.env.items()}
        if name in metrics_ports:
            env["HELIOS_METRICS_LISTEN"] = f"127.0.0.1:{metrics_ports[name]}"
        if name == "gateway":
            env["HELIOS_HOST"] = "127.0.0.1"
            env["HELIOS_PORT"] = str(ports["gateway"])
        image = (images or {}).get(name)
        if image:
            blocked = left_out_modules(image)
            env["PYTHONPATH"] = str(_blocker(workdir / f"site-{name}", blocked))
        deployment.env[name] = env
        deployment.argv[name] = [_rewrite(a, name, topology, ports, models_dir, redis_url)
                                 for a in spec.argv]
    with contextlib.ExitStack() as stack:
        for name in START_ORDER:
            deployment.processes[name] = stack.enter_context(ServiceProcess.start(
                ["serve", name, *deployment.argv[name]], workdir / f"{name}.log",
                env=deployment.env[name]))
        yield deployment


def python_command(test: list[str]) -> list[str]:
    """A compose healthcheck `[CMD, python, ...]` as a local command (this interpreter)."""
    if test[0] != "CMD":
        raise AssertionError(f"healthcheck {test} is not an exec-form CMD")
    command = test[1:]
    if command[0] == "python":
        command = [sys.executable, *command[1:]]
    return command
