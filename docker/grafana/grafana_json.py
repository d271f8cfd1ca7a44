"""Grafana dashboard JSON from a few typed pieces: panels, rows and their layout.

Used by docker/grafana/dashboard.py (the Helios dashboard's content). Everything here is plain
data for Grafana's dashboard model (schemaVersion 39: Grafana 10.4 and later); no Grafana
library is needed to write or read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 39
GRID_WIDTH = 24
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@dataclass(frozen=True, slots=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True, slots=True)
class Panel:
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"            # timeseries or stat
    width: int = 12
    height: int = 8
    stacked: bool = False
    max: float | None = None
    thresholds: tuple[tuple[str, float], ...] = ()   # (colour, from value) above green
    unstacked: tuple[str, ...] = ()     # legends drawn as dashed lines outside the stack


@dataclass(frozen=True, slots=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(slots=True)
class _Layout:
    next_id: int = 1
    y: int = 0
    panels: list[dict[str, Any]] = field(default_factory=list)

    def take_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


def _field_config(panel: Panel) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    steps += [{"color": colour, "value": value} for colour, value in panel.thresholds]
    defaults: dict[str, Any] = {"unit": panel.unit, "min": 0,
                                "thresholds": {"mode": "absolute", "steps": steps}}
    if panel.max is not None:
        defaults["max"] = panel.max
    if panel.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line", "lineWidth": 1, "fillOpacity": 15 if panel.stacked else 5,
            "showPoints": "never", "spanNulls": False,
            "stacking": {"mode": "normal" if panel.stacked else "none", "group": "A"},
        }
        if panel.thresholds:
            defaults["custom"]["thresholdsStyle"] = {"mode": "dashed"}
    else:
        defaults["color"] = {"mode": "thresholds"}
    overrides = [{
        "matcher": {"id": "byName", "options": legend},
        "properties": [
            {"id": "custom.stacking", "value": {"mode": "none", "group": "A"}},
            {"id": "custom.fillOpacity", "value": 0},
            {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
        ],
    } for legend in panel.unstacked]
    return {"defaults": defaults, "overrides": overrides}


def _options(panel: Panel) -> dict[str, Any]:
    if panel.kind == "stat":
        return {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "colorMode": "value", "graphMode": "area", "justifyMode": "auto",
                "orientation": "auto", "textMode": "auto", "showPercentChange": False,
                "wideLayout": True}
    return {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True,
                       "calcs": []},
            "tooltip": {"mode": "multi", "sort": "desc"}}


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "targets": [{"datasource": DATASOURCE, "expr": q.expr, "legendFormat": q.legend,
                     "refId": chr(ord("A") + i), "range": True, "instant": False,
                     "editorMode": "code"}
                    for i, q in enumerate(panel.queries)],
        "fieldConfig": _field_config(panel),
        "options": _options(panel),
    }


def _place_row(layout: _Layout, row: Row) -> None:
    layout.panels.append({"id": layout.take_id(), "type": "row", "title": row.title,
                          "collapsed": False, "panels": [],
                          "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": layout.y}})
    layout.y += 1
    x, line_height = 0, 0
    for panel in row.panels:
        if panel.width > GRID_WIDTH:
            raise ValueError(f"{panel.title}: wider than the grid")
        if x + panel.width > GRID_WIDTH:          # wrap to the next line of this row
            layout.y += line_height
            x, line_height = 0, 0
        layout.panels.append(_panel_json(panel, layout.take_id(), x, layout.y))
        x += panel.width
        line_height = max(line_height, panel.height)
    layout.y += line_height


def dashboard(*, uid: str, title: str, description: str, tags: tuple[str, ...],
              variables: list[dict[str, Any]], rows: tuple[Row, ...]) -> dict[str, Any]:
    layout = _Layout()
    for row in rows:
        _place_row(layout, row)
    return {
        "id": None,
        "uid": uid,
        "title": title,
        "description": description,
        "tags": list(tags),
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,                      # shared crosshair
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "links": [],
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard"}]},
        "templating": {"list": variables},
        "panels": layout.panels,
    }


def datasource_variable() -> dict[str, Any]:
    return {"name": "datasource", "label": "Datasource", "type": "datasource",
            "query": "prometheus", "current": {}, "hide": 0, "includeAll": False,
            "multi": False, "options": [], "refresh": 1, "regex": "", "skipUrlSync": False}


def query_variable(name: str, label: str, query: str, *, multi: bool) -> dict[str, Any]:
    """A variable filled from `label_values(...)`, with "All" matching every value (and series
    without the label: allValue is `.*`)."""
    return {"name": name, "label": label, "type": "query", "datasource": DATASOURCE,
            "definition": query, "query": {"query": query, "refId": f"{name}-values"},
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "hide": 0, "includeAll": True, "allValue": ".*", "multi": multi, "options": [],
            "refresh": 2, "regex": "", "sort": 1, "skipUrlSync": False}
