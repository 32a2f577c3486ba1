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


def test_descriptors_are_named_and_the_soaks_own_probes_told_apart() -> None:
    """bench.soak's naming of a process's descriptors, read from /proc for this process: a
    connection accepted on the probed port is PROBE, an outbound one is named by its peer's
    port, a file by its path; `difference` counts them as multisets."""
    import os
    import socket
    import tempfile

    from bench.soak import PROBE, descriptors, difference

    before = descriptors(os.getpid())
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    with tempfile.NamedTemporaryFile() as f:
        now = descriptors(os.getpid(), port)
        assert now.count(PROBE) == 1  # the accepted side; the listener is not a probe
        assert f"tcp -> :{port} state 1" in now  # the client's side: an established peer
        assert f.name in now
        added = difference(before, now)["added"]
        assert PROBE in added and f.name in added
    for s in (accepted, client, server):
        s.close()
    assert difference(now, descriptors(os.getpid(), port))["added"] == []
