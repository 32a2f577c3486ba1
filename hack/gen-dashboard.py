#!/usr/bin/env python3
"""Writes charts/cnidra/dashboards/cnidra.json, the Grafana dashboard the chart ships
(metrics.dashboard.enabled). Panels are listed here once; tests/test_dashboard.py checks the
file is this script's output and every query names only series docs/metrics.md lists."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).parents[1] / "charts" / "cnidra" / "dashboards" / "cnidra.json"
NODE = '{node=~"$node"}'
NODE_AND = 'node=~"$node"'

# (title, unit, [(query, legend)], width): a row is 24 wide
PANELS: list[tuple[str, str, list[tuple[str, str]], int]] = [
    (
        "Interfaces attached per second, by network",
        "ops",
        [
            (
                "sum by (network) (rate(cnidra_attach_duration_seconds_count"
                + NODE
                + "[$__rate_interval]))",
                "{{network}}",
            )
        ],
        8,
    ),
    (
        "Attach latency p50 / p99, by network",
        "s",
        [
            (
                "histogram_quantile(0.5, sum by (network, le) (rate(cnidra_attach_duration_seconds_bucket"
                + NODE
                + "[$__rate_interval])))",
                "p50 {{network}}",
            ),
            (
                "histogram_quantile(0.99, sum by (network, le) (rate(cnidra_attach_duration_seconds_bucket"
                + NODE
                + "[$__rate_interval])))",
                "p99 {{network}}",
            ),
        ],
        8,
    ),
    (
        "Attach failures, by network and reason",
        "ops",
        [
            (
                "sum by (network, reason) (rate(cnidra_attach_failures_total"
                + NODE
                + "[$__rate_interval]))",
                "{{network}}: {{reason}}",
            )
        ],
        8,
    ),
    (
        "Secondary interfaces: received (top 10)",
        "Bps",
        [
            (
                "topk(10, sum by (namespace, pod, interface) (rate(cnidra_pod_interface_receive_bytes_total"
                + NODE
                + "[$__rate_interval])))",
                "{{namespace}}/{{pod}} {{interface}}",
            )
        ],
        12,
    ),
    (
        "Secondary interfaces: transmitted (top 10)",
        "Bps",
        [
            (
                "topk(10, sum by (namespace, pod, interface) (rate(cnidra_pod_interface_transmit_bytes_total"
                + NODE
                + "[$__rate_interval])))",
                "{{namespace}}/{{pod}} {{interface}}",
            )
        ],
        12,
    ),
    (
        "Secondary interfaces: drops and errors",
        "pps",
        [
            (
                "sum by (namespace, pod, interface) (rate(cnidra_pod_interface_receive_drops_total"
                + NODE
                + "[$__rate_interval]) + rate(cnidra_pod_interface_transmit_drops_total"
                + NODE
                + "[$__rate_interval])) > 0",
                "drops {{namespace}}/{{pod}} {{interface}}",
            ),
            (
                "sum by (namespace, pod, interface) (rate(cnidra_pod_interface_receive_errors_total"
                + NODE
                + "[$__rate_interval]) + rate(cnidra_pod_interface_transmit_errors_total"
                + NODE
                + "[$__rate_interval])) > 0",
                "errors {{namespace}}/{{pod}} {{interface}}",
            ),
        ],
        8,
    ),
    (
        "IPAM: pool used (alert at 90 %)",
        "percentunit",
        [
            ("max by (pool) (cnidra_ipam_pool_used_ratio)", "{{pool}}"),
        ],
        8,
    ),
    (
        "IPAM: held and free addresses, by pool",
        "short",
        [
            ('max by (pool) (cnidra_ipam_pool_addresses{state="held"})', "held {{pool}}"),
            ('max by (pool) (cnidra_ipam_pool_addresses{state="free"})', "free {{pool}}"),
        ],
        8,
    ),
    (
        "IPAM: free blocks",
        "short",
        [
            (
                "max by (pool) (cnidra_ipam_pool_blocks) - sum by (pool) (cnidra_ipam_node_blocks)",
                "{{pool}}",
            )
        ],
        8,
    ),
    (
        "Prepare (NodePrepareResources) p99, by node",
        "s",
        [
            (
                'histogram_quantile(0.99, sum by (node, le) (rate(cnidra_dra_request_duration_seconds_bucket{method="NodePrepareResources", '
                + NODE_AND
                + "}[$__rate_interval])))",
                "{{node}}",
            )
        ],
        8,
    ),
    (
        "Claims prepared, by node",
        "short",
        [("sum by (node) (cnidra_prepared_claims" + NODE + ")", "{{node}}")],
        8,
    ),
    (
        "Driver health: task restarts and dropped writes",
        "short",
        [
            (
                "sum by (task) (increase(cnidra_task_restarts_total"
                + NODE
                + "[$__rate_interval]))",
                "restarted {{task}}",
            ),
            (
                'sum by (kind, outcome) (increase(cnidra_pod_writes_total{outcome!="ok", '
                + NODE_AND
                + "}[$__rate_interval]))",
                "{{kind}} {{outcome}}",
            ),
        ],
        8,
    ),
]


def panel(
    index: int, x: int, y: int, title: str, unit: str, targets: list[tuple[str, str]], width: int
) -> dict[str, Any]:
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": x, "y": y, "w": width, "h": 8},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def dashboard() -> dict[str, Any]:
    panels, x, y = [], 0, 0
    for index, (title, unit, targets, width) in enumerate(PANELS):
        if x + width > 24:
            x, y = 0, y + 8
        panels.append(panel(index, x, y, title, unit, targets, width))
        x += width
    return {
        "title": "cnidra: secondary networks",
        "uid": "cnidra",
        "description": "cnidra's DRA network driver: attaches, failures, per-interface traffic, IPAM (docs/metrics.md)",
        "tags": ["cnidra", "network", "dra"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "label": "Data source",
                },
                {
                    "name": "node",
                    "type": "query",
                    "label": "Node",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": "label_values(cnidra_build_info, node)",
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "current": {"text": "All", "value": "$__all"},
                    "refresh": 2,
                },
            ]
        },
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        sys.exit(0 if OUT.read_text() == render() else 1)
    OUT.write_text(render())
