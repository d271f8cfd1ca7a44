"""Message marks: where each complete message (and the preamble) ends in a rendered prompt.

Hugging Face chat templates do not say where messages end, and re-rendering every prefix of a
conversation would cost O(turns^2). Instead the template is annotated once, at load, in its
Jinja syntax tree: each loop that renders the conversation (a `for` over `messages` or a list
derived from it by slicing or filtering, e.g. `loop_messages = messages[1:]`) gets

- a mark right before the loop: the end of the preamble (system prompt, tool definitions);
- a mark at the end of every iteration: the end of that message.

A mark is an output node emitting a per-template random sentinel string; after rendering the
sentinels are cut out and their character positions recorded. Inserting nodes into the syntax
tree (not the source text) leaves whitespace control untouched, and the sentinel only ever goes
straight to the output: loops inside macros, call blocks, filter blocks or captured `set`
blocks are not annotated (their output may be transformed before it is emitted), nor are loops
nested in an annotated loop. A `{% continue %}` simply skips that iteration's mark. Marks are
advisory: `endpoints.py` keeps only those that fall between tokens.
"""

from __future__ import annotations

import secrets

from jinja2 import nodes

# Nodes whose body output is captured into a value instead of written to the output stream.
_BUFFERED = (nodes.Macro, nodes.CallBlock, nodes.FilterBlock, nodes.AssignBlock)
_ORDER_PRESERVING_FILTERS = frozenset({"selectattr", "rejectattr", "select", "reject", "list",
                                       "batch", "unique"})


def new_sentinel() -> str:
    """A sentinel no input can contain by accident: private-use delimiters around 128 bits."""
    return "\U000f8000" + secrets.token_hex(16) + "\U000f8001"


def _root_alias(expr: nodes.Node, aliases: set[str]) -> bool:
    """True when `expr` is a message list: an alias, a forward slice of one, or a filter of one."""
    while True:
        if isinstance(expr, nodes.Name):
            return expr.name in aliases
        if isinstance(expr, nodes.Getitem) and isinstance(expr.arg, nodes.Slice):
            step = expr.arg.step
            if step is not None and not (isinstance(step, nodes.Const) and step.value == 1):
                return False  # messages[::-1] and friends do not render in order
            expr = expr.node
        elif isinstance(expr, nodes.Filter) and expr.name in _ORDER_PRESERVING_FILTERS:
            if expr.node is None:
                return False
            expr = expr.node
        else:
            return False


def _message_aliases(tree: nodes.Template) -> set[str]:
    """`messages` plus every name assigned a message list (`set loop_messages = messages[1:]`)."""
    aliases = {"messages"}
    assigns = [a for a in tree.find_all(nodes.Assign) if isinstance(a.target, nodes.Name)]
    changed = True
    while changed:
        changed = False
        for assign in assigns:
            name = assign.target.name  # type: ignore[attr-defined]
            if name not in aliases and _root_alias(assign.node, aliases):
                aliases.add(name)
                changed = True
    return aliases


def _has_output(body: list[nodes.Node]) -> bool:
    for node in body:
        if isinstance(node, nodes.Output):
            return True
        if not isinstance(node, _BUFFERED) and any(
                isinstance(child, nodes.Output) for child in node.find_all(nodes.Output)):
            return True
    return False


def _mark(sentinel: str) -> nodes.Output:
    return nodes.Output([nodes.TemplateData(sentinel)])


def annotate(tree: nodes.Template, sentinel: str) -> int:
    """Insert marks into `tree` in place; return how many loops were annotated."""
    aliases = _message_aliases(tree)
    count = 0

    def visit(node: nodes.Node, blocked: bool) -> None:
        nonlocal count
        for _field, value in node.iter_fields():
            if isinstance(value, nodes.Node):
                visit(value, blocked or isinstance(value, _BUFFERED))
                continue
            if not isinstance(value, list):
                continue
            index = 0
            while index < len(value):
                child = value[index]
                if not isinstance(child, nodes.Node):
                    index += 1
                    continue
                child_blocked = blocked or isinstance(child, _BUFFERED)
                if (isinstance(child, nodes.For) and not child_blocked and not child.recursive
                        and _root_alias(child.iter, aliases) and _has_output(child.body)):
                    child.body.append(_mark(sentinel))
                    value.insert(index, _mark(sentinel))
                    index += 1
                    count += 1
                    child_blocked = True  # no marks inside an annotated loop
                visit(child, child_blocked)
                index += 1

    visit(tree, False)
    return count


def extract(rendered: str, sentinel: str) -> tuple[str, list[int]]:
    """Cut the sentinels out of `rendered`: the prompt and each mark's character position."""
    pieces = rendered.split(sentinel)
    if len(pieces) == 1:
        return rendered, []
    positions: list[int] = []
    offset = 0
    for piece in pieces[:-1]:
        offset += len(piece)
        positions.append(offset)
    return "".join(pieces), positions
