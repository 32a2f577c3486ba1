from __future__ import annotations

from cnidra.api.merge import ConfigEntry, Source, applicable, merge_parameters, merge_patch


def entry(source: Source, requests: tuple[str, ...] = (), **params: object) -> ConfigEntry:
    return ConfigEntry(source, params, requests)


def test_class_configs_come_first_then_claim_configs_in_written_order() -> None:
    c1 = entry(Source.CLAIM, ifName="a")
    k1 = entry(Source.CLASS, ifName="k")
    c2 = entry(Source.CLAIM, ("net",), ifName="b")
    assert applicable([c1, k1, c2], "net") == [k1, c1, c2]
    assert merge_parameters(applicable([c1, k1, c2], "net"))["ifName"] == "b"


def test_request_scoping_and_subrequests() -> None:
    only_a = entry(Source.CLAIM, ("a",), ifName="a1")
    everyone = entry(Source.CLAIM, (), ifName="x")
    assert applicable([only_a, everyone], "b") == [everyone]
    assert applicable([only_a], "a/fast") == [only_a]
    assert applicable([entry(Source.CLAIM, ("a/fast",))], "a/slow") == []


def test_config_merges_as_json_merge_patch() -> None:
    base = entry(
        Source.CLASS,
        config={
            "cniVersion": "1.0.0",
            "name": "n",
            "plugins": [{"type": "macvlan"}],
            "disableCheck": True,
        },
    )
    over = entry(Source.CLAIM, config={"plugins": [{"type": "bridge"}], "disableCheck": None})
    merged = merge_parameters([base, over])["config"]
    assert merged == {"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "bridge"}]}


def test_args_and_capabilities_merge_key_by_key() -> None:
    merged = merge_parameters(
        [
            entry(Source.CLASS, args={"A": "1", "B": "1"}, capabilities={"mac": "x"}),
            entry(Source.CLAIM, args={"B": "2"}, capabilities={"ips": ["y"]}),
        ]
    )
    assert merged["args"] == {"A": "1", "B": "2"}
    assert merged["capabilities"] == {"mac": "x", "ips": ["y"]}


def test_merge_patch_never_mutates_its_inputs() -> None:
    target = {"a": {"b": 1}}
    patch = {"a": {"c": 2}}
    assert merge_patch(target, patch) == {"a": {"b": 1, "c": 2}}
    assert target == {"a": {"b": 1}} and patch == {"a": {"c": 2}}
