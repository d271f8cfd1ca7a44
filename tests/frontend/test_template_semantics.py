"""Jinja semantics against transformers, live: custom templates exercising each HF extension.

transformers' `render_jinja_template` (what `apply_chat_template` calls) renders the same
template and inputs; outputs and errors must be identical.
"""

from __future__ import annotations

import datetime

import jinja2
import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from services.frontend.chat.template import ChatTemplate

MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Café ☕ \"quoted\" <b>&</b>"},
            {"role": "assistant", "content": "Sure.",
             "tool_calls": [{"type": "function", "function": {
                 "name": "f", "arguments": {"b": 1, "a": [1.5, None, True], "ü": "ß"}}}]},
            {"role": "user", "content": "  padded  "}]
TOOLS = [{"type": "function", "function": {"name": "f", "description": "d",
                                           "parameters": {"type": "object"}}}]

TEMPLATES = {
    "tojson_defaults": "{% for m in messages %}{{ m | tojson }}\n{% endfor %}",
    "tojson_options": ("{{ messages | tojson(indent=2) }}|{{ tools | tojson(sort_keys=true) }}|"
                       "{{ messages[2].tool_calls[0].function.arguments | tojson("
                       "separators=(',', ':'), ensure_ascii=true) }}"),
    "loop_controls": ("{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
                      "{% if loop.index > 3 %}{% break %}{% endif %}[{{ loop.index0 }}:{{ m.role }}"
                      "{{ '|last' if loop.last }}]{% endfor %}"),
    "whitespace_control": ("{%- for m in messages %}\n  {{- m.role }}:\n    {{ m.content | trim }}\n"
                           "{% if not loop.last %}\n---\n{% endif %}\n{%- endfor %}\n"
                           "{%- if add_generation_prompt %}\nassistant:{% endif %}\n\n"),
    "generation_block": ("{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
                         "{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}"
                         "{% endfor %}"),
    "namespace_and_dict": ("{% set ns = namespace(count=0, seen=[]) %}{% for m in messages %}"
                           "{% set ns.count = ns.count + 1 %}{% endfor %}{{ ns.count }}"
                           "{{ dict(a=1, b=ns.count) | tojson }}{{ dict.fromkeys(['x', 'y']) }}"),
    "python_methods": ("{{ messages[1].content.split(' ')[0].upper() }}|"
                       "{{ messages[3].content.strip() }}|{{ '%s-%d' % ('a', 3) }}|"
                       "{{ messages | map(attribute='role') | join(',') }}|"
                       "{{ messages[2].tool_calls[0].function.arguments.items() | list }}"),
    "raise_exception": ("{% if messages[0].role != 'user' %}"
                        "{{ raise_exception('First message must be from the user, got ' "
                        "+ messages[0].role) }}{% endif %}"),
    "undefined_attribute": "{{ messages[0].content.nope.deeper }}",
    "type_error": "{{ messages[0].content + messages[2].tool_calls }}",
    "namespace_underscore": "{% set ns = namespace(_private=1) %}{{ ns._private }}",
    "kwargs_and_special_tokens": ("{{ bos_token }}{% if enable_thinking is defined %}"
                                  "{{ enable_thinking }}{% else %}default{% endif %}{{ custom }}"),
    "strftime": "{{ strftime_now('%Y-%m-%d') }}",
}


def _ours(source: str, **kwargs):
    template = ChatTemplate(source)
    return template.render([dict(m) for m in MESSAGES], tools=TOOLS, documents=None,
                           add_generation_prompt=True, continue_final_message=False,
                           kwargs=kwargs).prompt


def _theirs(source: str, **kwargs):
    rendered, _ = render_jinja_template(conversations=[[dict(m) for m in MESSAGES]],
                                        tools=TOOLS, chat_template=source,
                                        add_generation_prompt=True, **kwargs)
    return rendered[0]


def _outcome(render, source, **kwargs):
    try:
        return ("ok", render(source, **kwargs))
    except Exception as exc:
        return (type(exc).__name__, str(exc))


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_matches_transformers(name):
    kwargs = {"bos_token": "<s>", "custom": "✓"}
    if name == "kwargs_and_special_tokens":
        kwargs["enable_thinking"] = False
    ours = _outcome(_ours, TEMPLATES[name], **kwargs)
    theirs = _outcome(_theirs, TEMPLATES[name], **kwargs)
    assert ours == theirs
    if name in ("raise_exception", "undefined_attribute", "type_error", "namespace_underscore"):
        assert ours[0] != "ok"
    else:
        assert ours[0] == "ok"


def test_strftime_now_is_local_time():
    assert _ours(TEMPLATES["strftime"]) in {
        (datetime.datetime.now() - datetime.timedelta(seconds=s)).strftime("%Y-%m-%d")
        for s in (0, 5)}


def test_sandbox_blocks_python_internals():
    with pytest.raises(jinja2.exceptions.SecurityError):
        _ours("{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}"
              "{{ cycler.__init__.__globals__ }}{% set x = messages.append(1) %}")
