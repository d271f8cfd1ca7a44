"""Frozen config dataclasses from defaults, an optional YAML file, the environment and flags.

Each service declares one frozen dataclass (STYLE.md #11) whose fields carry their help text in
`field(metadata={"help": ...})` and whose `__post_init__` validates. `load_config` fills it with
this precedence, lowest first:

    dataclass default < YAML file (--config FILE) < environment (HELIOS_<FIELD>) < CLI flags

A YAML file may hold the fields at its top level or under a section named after the service
(`engine:`, `frontend:` ...), so one file can configure a whole `helios run`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from services.common.errors import ValidationError

T = TypeVar("T")

ENV_PREFIX = "HELIOS_"


def option(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field with help text for the generated flag."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("use a tuple default for sequence options")
    return dataclasses.field(default=default, metadata={"help": help, **kwargs})


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _convert(name: str, tp: Any, value: Any) -> Any:
    """Convert a YAML/env/flag value to the field's declared type."""
    base, optional = _unwrap_optional(tp)
    if value is None or (optional and isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        if optional:
            return None
        raise ValidationError(f"config field {name!r} may not be empty", param=name)
    try:
        if base is bool:
            return value if isinstance(value, bool) else _parse_bool(str(value))
        if base is int:
            if isinstance(value, bool):
                raise ValueError("boolean is not an integer")
            return int(value)
        if base is float:
            return float(value)
        if base is str:
            return str(value)
        if base is Path:
            return Path(value)
        if typing.get_origin(base) is tuple:
            (item_tp, *_rest) = typing.get_args(base) or (str,)
            items = value.split(",") if isinstance(value, str) else list(value)
            return tuple(_convert(name, item_tp, item.strip() if isinstance(item, str) else item)
                         for item in items if not (isinstance(item, str) and not item.strip()))
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"config field {name!r}: {exc}", param=name) from exc
    raise TypeError(f"unsupported config type {tp!r} for {name!r}")


SECTIONS = ("gateway", "frontend", "imageprep", "engine")


def _section(data: Mapping[str, Any], section: str) -> Mapping[str, Any]:
    """A file with service sections gives this service's section (others are ignored);
    a flat file is entirely this service's."""
    if any(key in SECTIONS for key in data):
        chosen = data.get(section, {}) if section else {}
        return chosen if isinstance(chosen, Mapping) else {}
    return data


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser(cls: type, *, prog: str | None = None, description: str | None = None
                 ) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description or cls.__doc__,
                                     argument_default=argparse.SUPPRESS)
    parser.add_argument("--config", type=Path, help="YAML config file")
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        tp, _ = _unwrap_optional(hints[field.name])
        help_text = field.metadata.get("help", "")
        default = field.default if field.default is not dataclasses.MISSING else None
        env = ENV_PREFIX + field.name.upper()
        help_text = f"{help_text} [env {env}; default {default!r}]"
        if tp is bool:
            parser.add_argument(_flag(field.name), dest=field.name,
                                action=argparse.BooleanOptionalAction, help=help_text)
        else:
            parser.add_argument(_flag(field.name), dest=field.name, type=str, help=help_text,
                                metavar=field.name.upper())
    return parser


def load_config(
    cls: type[T],
    argv: Sequence[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    section: str = "",
    prog: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> T:
    """Build `cls` from defaults < YAML < env < flags (< explicit overrides)."""
    env = os.environ if env is None else env
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    parser = build_parser(cls, prog=prog)
    parsed = vars(parser.parse_args(list(argv or [])))

    values: dict[str, Any] = {}
    config_path = parsed.pop("config", None) or env.get(ENV_PREFIX + "CONFIG")
    if config_path:
        path = Path(config_path)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ValidationError(f"cannot read config file {path}: {exc}") from exc
        if not isinstance(data, Mapping):
            raise ValidationError(f"config file {path} must hold a mapping")
        chosen = _section(data, section)
        unknown = set(chosen) - names
        if unknown:
            raise ValidationError(f"unknown config keys in {path}: {sorted(unknown)}")
        values.update({k: _convert(k, hints[k], v) for k, v in chosen.items()})
    for name in names:
        key = ENV_PREFIX + name.upper()
        if key in env:
            values[name] = _convert(name, hints[name], env[key])
    for name, raw in parsed.items():
        values[name] = _convert(name, hints[name], raw)
    values.update(overrides or {})
    try:
        return cls(**values)
    except TypeError as exc:
        raise ValidationError(f"invalid {cls.__name__}: {exc}") from exc


def to_flags(config: Any) -> list[str]:
    """Render a config back into CLI flags (the launcher passes configs to child processes)."""
    flags: list[str] = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if value is None:
            continue
        if isinstance(value, bool):
            flags.append(_flag(field.name) if value else "--no-" + field.name.replace("_", "-"))
        elif isinstance(value, tuple):
            flags += [_flag(field.name), ",".join(str(v) for v in value)]
        else:
            flags += [_flag(field.name), str(value)]
    return flags


LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclasses.dataclass(frozen=True)
class CommonConfig:
    """Fields every Helios process shares (logging and shutdown)."""

    log_level: str = option("info", "debug, info, warning or error")
    log_format: str = option("text", "text (key=value lines) or json (one object per line)")
    grace_period_s: float = option(5.0, "seconds active requests get to finish on SIGTERM")

    def __post_init__(self) -> None:
        if self.log_level not in LOG_LEVELS:
            raise ValidationError(f"log_level must be one of {LOG_LEVELS}", param="log_level")
        if self.log_format not in ("text", "json"):
            raise ValidationError("log_format must be text or json", param="log_format")
        if self.grace_period_s < 0:
            raise ValidationError("grace_period_s must be >= 0", param="grace_period_s")


@dataclasses.dataclass(frozen=True)
class ServiceConfig(CommonConfig):
    """Fields every gRPC service shares; each service's config extends this."""

    listen: str = option("127.0.0.1:50051", "gRPC listen address: host:port or unix:///path")
    metrics_listen: str = option("", "Prometheus /metrics HTTP address host:port ('' = off)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.listen:
            raise ValidationError("listen must not be empty", param="listen")
        if self.metrics_listen:
            from services.common.metrics import parse_listen

            parse_listen(self.metrics_listen)
