"""bench.report's row of the node's whole CPU per pod (issue 42): cnidra's against the better of
Multus thin and thick, both named, from sample bench.pod_ready results; and the pod-ready
table's fifth way. Rendered without the test bed."""

from __future__ import annotations

from typing import Any

from bench import report
from tests.bench.test_run_report import rows, sample

ROW = "node CPU per pod (driver + the plugins it execs) ≤ Multus'"


def with_node_cpu(**figures: Any) -> dict[str, Any]:
    """The sample run, its pod_ready result with these keys added."""
    data = sample()
    data["benches"]["pod_ready"]["result"].update(figures)
    return data


NODE = {"none": 0.0, "dra_example": 3.1, "multus": 24.77, "multus_thick": 31.5, "cnidra": 18.2}


def test_met_against_the_better_multus_and_both_named() -> None:
    measured, verdict = rows(
        with_node_cpu(
            node_cpu_ms_per_pod=NODE,
            node_cpu_ms_per_pod_by_part={
                "cnidra": {
                    "containerd": 10.0,
                    "shims": 4.5,
                    "kubelet": 28.6,
                    "daemon": 30.0,
                    "total": 73.1,
                }
            },
            control_plane_cpu_ms_per_pod={"cnidra": 12.0, "multus": 4.0, "multus_thick": 6.5},
        )
    )[ROW]
    assert verdict == "met"
    assert measured.startswith(
        "cnidra 18.2 ms ≤ Multus thin 24.8 ms (the better; Multus thin 24.8 ms, thick 31.5 ms), "
        "beyond a pod without a secondary network"
    )
    assert "containerd 10.0, shims 4.5, kubelet 28.6, daemon 30.0" in measured
    assert "total" not in measured
    assert measured.endswith(
        "the control plane's beside (other machines in a real cluster, ms a pod): "
        "cnidra 12.0, Multus thin 4.0, Multus thick 6.5"
    )


def test_not_met_by_how_much_against_thick_when_it_is_the_better() -> None:
    figures = {**NODE, "multus": 40.0, "multus_thick": 20.0, "cnidra": 25.0}
    measured, verdict = rows(with_node_cpu(node_cpu_ms_per_pod=figures))[ROW]
    assert measured.startswith("cnidra 25.0 ms > Multus thick 20.0 ms (the better; ")
    assert "Multus thin 40.0 ms, thick 20.0 ms" in measured
    assert verdict == "**not met** by 5.0 ms (25 %)"


def test_one_multus_missing_is_named_and_the_other_compared() -> None:
    figures = {"none": 0.0, "multus": 24.0, "cnidra": 18.0}
    measured, verdict = rows(with_node_cpu(node_cpu_ms_per_pod=figures))[ROW]
    assert "Multus thin 24.0 ms, thick not measured" in measured
    assert verdict == "met"


def test_missing_figures_say_so() -> None:
    assert rows(sample())[ROW] == (
        "–",
        "not measured (no `node_cpu_ms_per_pod.cnidra` in bench.pod_ready's result)",
    )
    only_cnidra = with_node_cpu(node_cpu_ms_per_pod={"cnidra": 18.0})
    assert rows(only_cnidra)[ROW][1].startswith("not measured (no Multus way")
    data = sample()
    data["benches"]["pod_ready"] = {"status": "failed", "reason": "exit 1"}
    assert rows(data)[ROW] == ("–", "not run (exit 1)")


def test_the_other_rows_stay() -> None:
    got = rows(with_node_cpu(node_cpu_ms_per_pod=NODE))
    assert len(got) == len(report.GOALS)
    assert "driver CPU per pod ≤ 20 ms" in got
    assert report.REQUESTS_GOAL in got
    goals = [goal for goal, _, _, _ in report.GOALS]
    assert goals.index(ROW) == goals.index("driver CPU per pod ≤ 20 ms") + 1


def test_the_pod_ready_table_has_the_fifth_way() -> None:
    data = sample()
    result = data["benches"]["pod_ready"]["result"]
    text = report.block(data, "x.json")
    assert "the same pods four ways" in text  # a run from before multus_thick
    thick = "| the same NAD through Multus thick (multus-daemon, multus-shim) |"
    assert f"{thick} not measured |" in text
    result["multus_thick"] = {"p50_s": 9.9, "p99_s": 12.5}
    result["one_pod"]["multus_thick"] = {"p50_s": 0.65, "p99_s": 0.7}
    text = report.block(data, "x.json")
    assert "the same pods five ways" in text
    assert f"{thick} 9.90 / 12.50 s | 0.650 / 0.700 s |" in text
