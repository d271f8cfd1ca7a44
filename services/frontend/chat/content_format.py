"""Does a chat template read message content as a list of parts or as a string?

OpenAI-style clients send `"content": [{"type": "text", "text": ...}, ...]`. Templates written
for vision models walk that list (`{% for part in message['content'] %}`, Gemma 3's
`messages[0]['content'][0]['text']`); text-only templates (Qwen3, ChatML, Llama 3.1) concatenate
`message.content` as a string and fail or print a Python list when given parts. Like vLLM's
content-format detection, the decision is made once from the template's syntax tree:

- names bound to the conversation: `messages`, and names assigned from it (`loop_messages =
  messages[1:]`, through filters);
- message expressions: loop targets over those (`for message in loop_messages`) and indexed
  elements (`messages[0]`), and names assigned from them;
- content expressions: `<message>.content` / `<message>['content']`, and names assigned from them;
- the template is OPENAI (parts) when it iterates over a content expression (through filters:
  `message.content | selectattr(...)`) or indexes one with a number (`content[0]['type']`);
  otherwise STRING.

template_data.py then passes parts to OPENAI templates and, for STRING templates, joins
text-only parts with newlines (as vLLM does). Images always stay parts.
"""

from __future__ import annotations

import enum

from jinja2 import nodes


class ContentFormat(enum.Enum):
    OPENAI = "openai"     # content as a list of {"type": ...} parts
    STRING = "string"     # content as one string


def _base(node: nodes.Node) -> nodes.Node:
    """The expression under filters and tests (`x | trim`, `x is string`)."""
    while isinstance(node, (nodes.Filter, nodes.Test)) and node.node is not None:
        node = node.node
    return node


def _is_name(node: nodes.Node, names: set[str]) -> bool:
    return isinstance(node, nodes.Name) and node.ctx == "load" and node.name in names


def _is_slice(node: nodes.Node) -> bool:
    return isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice)


def _is_list_of_messages(node: nodes.Node, lists: set[str]) -> bool:
    node = _base(node)
    while _is_slice(node):
        node = _base(node.node)  # type: ignore[attr-defined]
    return _is_name(node, lists)


def _is_message(node: nodes.Node, lists: set[str], items: set[str]) -> bool:
    node = _base(node)
    if _is_name(node, items):
        return True
    return (isinstance(node, nodes.Getitem) and not _is_slice(node)
            and _is_list_of_messages(node.node, lists))


def _is_content(node: nodes.Node, lists: set[str], items: set[str], contents: set[str]
                ) -> bool:
    node = _base(node)
    if _is_name(node, contents):
        return True
    if isinstance(node, nodes.Getattr) and node.attr == "content":
        return _is_message(node.node, lists, items)
    if (isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const)
            and node.arg.value == "content"):
        return _is_message(node.node, lists, items)
    return False


def _assigned(tree: nodes.Template) -> list[tuple[str, nodes.Node]]:
    pairs = []
    for assign in tree.find_all(nodes.Assign):
        if isinstance(assign.target, nodes.Name):
            pairs.append((assign.target.name, assign.node))
    return pairs


def detect_content_format(tree: nodes.Template) -> ContentFormat:
    assigned = _assigned(tree)
    loops = list(tree.find_all(nodes.For))
    lists: set[str] = {"messages"}
    items: set[str] = set()
    contents: set[str] = set()
    changed = True
    while changed:  # to a fixed point: names derived from names derived from messages
        before = (len(lists), len(items), len(contents))
        for name, value in assigned:
            if _is_list_of_messages(value, lists):
                lists.add(name)
            elif _is_message(value, lists, items):
                items.add(name)
            elif _is_content(value, lists, items, contents):
                contents.add(name)
        for loop in loops:
            if isinstance(loop.target, nodes.Name) and _is_list_of_messages(loop.iter, lists):
                items.add(loop.target.name)
        changed = before != (len(lists), len(items), len(contents))
    for loop in loops:
        if _is_content(loop.iter, lists, items, contents):
            return ContentFormat.OPENAI
    for item in tree.find_all(nodes.Getitem):
        if (isinstance(item.arg, nodes.Const) and isinstance(item.arg.value, int)
                and not isinstance(item.arg.value, bool)
                and _is_content(item.node, lists, items, contents)):
            return ContentFormat.OPENAI
    return ContentFormat.STRING
