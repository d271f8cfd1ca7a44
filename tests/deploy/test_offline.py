"""The validators need no network: Helm renders and lints, the Kubernetes schemas load, Compose
reads its file and hadolint lints, all inside a fresh network namespace (only a loopback interface, and it is down)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.deploy.tools import REPO

SCRIPT = textwrap.dedent("""\
    import socket
    interfaces = [name for _, name in socket.if_nameindex()]
    assert interfaces == ["lo"], f"not an isolated namespace: {interfaces}"
    from tests.deploy.tools import (compose_config, hadolint, lint_chart, render_chart,
                                    validate_kubernetes, REPO)
    rendered = render_chart({"engine": {"gpu": {"enabled": True}}, "redis": {"enabled": True}})
    assert lint_chart()["errors"] == []
    problems = [validate_kubernetes(o) for o in rendered.objects]
    assert not any(problems), problems
    assert "engine" in compose_config()["services"]
    assert hadolint(REPO / "docker" / "Dockerfile.engine").returncode == 0
    print("offline ok")
    """)


def test_validators_work_without_a_network():
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "--net", "true"], capture_output=True,
                                         check=False).returncode != 0:
        pytest.skip("cannot create a network namespace here (needs root and unshare)")
    result = subprocess.run([unshare, "--net", sys.executable, "-c", SCRIPT], cwd=REPO,
                            capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0 and "offline ok" in result.stdout, result.stdout + result.stderr
