"""The Grafana dashboard's PromQL, read with a real PromQL parser (promql-parser: a Rust port of
Prometheus' own grammar) after Grafana's variables are substituted the way Grafana would.

`analyse(expr)` returns what a query selects and the mistakes that make a panel silently empty
or wrong: rate() over a gauge, histogram_quantile() without `le`, a binary operation whose two
sides carry different labels (no series match), a legend naming a label the result lacks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import promql_parser as pq

# What Grafana puts in place of its built-in and the dashboard's own variables.
BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}
VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
COUNTER_SUFFIXES = ("_total", "_bucket", "_sum", "_count")
RATE_FUNCTIONS = {"rate", "irate", "increase"}


def substitute(expr: str, variables: Mapping[str, str]) -> str:
    """`expr` with every $var / ${var} replaced (KeyError for an undefined one)."""
    values = {**BUILTINS, **variables}
    return VARIABLE.sub(lambda m: values[m.group(1) or m.group(2)], expr)


def used_variables(text: str) -> set[str]:
    return {m.group(1) or m.group(2) for m in VARIABLE.finditer(text)}


@dataclass(frozen=True)
class Selector:
    name: str
    matchers: tuple[tuple[str, str], ...]      # (label, value) pairs, names excluded
    in_rate: bool                              # inside rate()/irate()/increase()


@dataclass
class Analysis:
    selectors: list[Selector] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    output_labels: frozenset[str] | None = None    # None: every label of the selected series


def _selector_labels(node: pq.VectorSelector) -> tuple[tuple[str, str], ...]:
    return tuple((m.name, m.value) for m in node.matchers.matchers if m.name != "__name__")


def _show(labels: frozenset[str] | None) -> str:
    return "every label of the series" if labels is None else f"by ({', '.join(sorted(labels))})"


def _labels(node: pq.Expr, analysis: Analysis, in_rate: bool = False) -> frozenset[str] | None:
    """The labels of `node`'s result (None: all of the selected series' labels, unknown here),
    collecting selectors and problems on the way."""
    if isinstance(node, pq.VectorSelector):
        if node.name is None:
            analysis.problems.append(f"a selector without a metric name: {node}")
            return None
        analysis.selectors.append(Selector(node.name, _selector_labels(node), in_rate))
        if in_rate and not node.name.endswith(COUNTER_SUFFIXES):
            analysis.problems.append(f"rate() over {node.name}, which is not a counter")
        return None
    if isinstance(node, pq.MatrixSelector):
        return _labels(node.vector_selector, analysis, in_rate)
    if isinstance(node, pq.ParenExpr | pq.UnaryExpr):
        return _labels(node.expr, analysis, in_rate)
    if isinstance(node, pq.NumberLiteral | pq.StringLiteral):
        return frozenset()
    if isinstance(node, pq.AggregateExpr):
        inner = _labels(node.expr, analysis, in_rate)
        modifier = node.modifier
        if modifier is None:
            return frozenset()
        if modifier.type == pq.AggModifierType.By:
            return frozenset(modifier.labels)
        return None if inner is None else inner - set(modifier.labels)
    if isinstance(node, pq.Call):
        name = node.func.name
        results = [_labels(arg, analysis, in_rate or name in RATE_FUNCTIONS)
                   for arg in node.args]
        if name == "histogram_quantile":
            buckets = results[1]
            if buckets is None or "le" not in buckets:
                analysis.problems.append(f"histogram_quantile over {node.args[1]}: aggregate "
                                         "by (le) first")
                return None
            return buckets - {"le"}
        vectors = [r for r, a in zip(results, node.args, strict=True)
                   if not isinstance(a, pq.NumberLiteral | pq.StringLiteral)]
        return vectors[0] if vectors else frozenset()
    if isinstance(node, pq.BinaryExpr):
        left = _labels(node.lhs, analysis, in_rate)
        right = _labels(node.rhs, analysis, in_rate)
        scalar = (isinstance(node.lhs, pq.NumberLiteral), isinstance(node.rhs, pq.NumberLiteral))
        if any(scalar):
            return right if scalar[0] else left
        if node.modifier is not None:
            analysis.problems.append(f"{node}: on()/ignoring() matching is not used here; "
                                     "aggregate both sides by the same labels instead")
        if left is None or right is None or left != right:
            analysis.problems.append(f"{node}: the two sides carry different labels "
                                     f"({_show(left)} vs {_show(right)}), so series may not "
                                     "match; aggregate both by the same labels")
        return left
    analysis.problems.append(f"unsupported expression {type(node).__name__}: {node}")
    return None


def analyse(expr: str, variables: Mapping[str, str], legend: str = "") -> Analysis:
    analysis = Analysis()
    tree = pq.parse(substitute(expr, variables))      # ValueError on a syntax error
    analysis.output_labels = _labels(tree, analysis)
    for label in LEGEND_LABEL.findall(legend):
        if analysis.output_labels is None or label not in analysis.output_labels:
            analysis.problems.append(f"legend {legend!r} names {label}, which the result "
                                     f"does not keep ({_show(analysis.output_labels)})")
    return analysis


def label_values_selector(query: str) -> str:
    """The series selector inside a Grafana `label_values(SELECTOR, LABEL)` variable query."""
    match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query.strip())
    if match is None:
        raise ValueError(f"not a label_values() query: {query}")
    return match.group(1)
