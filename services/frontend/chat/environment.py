"""The Jinja environment chat templates run in, with Hugging Face transformers' semantics.

Chat templates are untrusted code shipped with checkpoints, written against transformers'
`apply_chat_template`. To render them byte-identically this environment matches the one
transformers builds (utils/chat_template_utils.py):

- an immutable sandbox with `trim_blocks` and `lstrip_blocks`, plus loop controls
  (`{% break %}`, `{% continue %}`);
- `raise_exception(message)` raising `jinja2.TemplateError(message)`;
- a `tojson` filter that is `json.dumps` with HF's defaults (no ASCII escaping, no HTML
  escaping, optional indent / separators / sort_keys);
- `strftime_now(format)` formatting the local time;
- `dict(...)` and `namespace(...)` globals that refuse underscore-prefixed names;
- `{% generation %} ... {% endgeneration %}` blocks that emit their body and nothing else.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message: Any) -> None:
    raise jinja2.exceptions.TemplateError(message)


def tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
           sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class TemplateDict:
    """`dict(...)` for templates without exposing the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class TemplateNamespace(jinja2.utils.Namespace):
    """`namespace(...)` that rejects underscore-prefixed attributes (no CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                "Chat templates cannot store underscore-prefixed attributes on a namespace, but "
                f"got {name!r}. Please rename the attribute.")


class GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: the body in its own scope, nothing added.

    transformers uses these blocks to compute assistant-token masks for training; for serving
    they only emit their body.
    """

    tags = {"generation"}  # noqa: RUF012 - the attribute jinja2.ext.Extension declares

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def make_environment() -> ImmutableSandboxedEnvironment:
    """A fresh environment configured like transformers' chat-template environment."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env
