"""bench.soak's accounting of metrics series: a series about a pod still there when every pod
is gone is a leak; a first response code is not, and is listed for the reader."""

from __future__ import annotations

from bench.soak import new_series


def test_series_naming_a_pod_are_leaks_others_are_listed() -> None:
    base = {'cnidra_apiserver_requests_total{code="200",resource="pods",verb="patch"}'}
    now = base | {
        'cnidra_apiserver_requests_total{code="409",resource="pods",verb="patch"}',
        'cnidra_pod_interface_receive_bytes_total{claim="c",interface="net1",namespace="n",'
        'pod="p1",request="r"}',
        'cnidra_attach_duration_seconds_bucket{le="0.1",network="a"}',
        'cnidra_attach_duration_seconds_count{network="a"}',
    }
    leaks, shown = new_series(base, now)
    assert leaks == 1
    assert shown == [
        'cnidra_apiserver_requests_total{code="409",resource="pods",verb="patch"}',
        'cnidra_attach_duration_seconds_count{network="a"}',
    ]
