"""The one apiserver layer: no module of cnidra imports lightkube or httpx2, none outside
cnidra/kube imports aiohttp (the apiserver's client), and one table decides what an apiserver
failure is."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import pytest

from cnidra.kube.api import (
    Api,
    ApiFailure,
    Conflict,
    Invalid,
    NotFound,
    RefusedForGood,
    Transient,
    UidPrecondition,
    api_failure,
    classify,
)
from cnidra.kube.client import is_transient, retry_after
from cnidra.kube.session import ApiStatus

PACKAGE = Path(__file__).parents[2] / "cnidra"


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_no_module_of_cnidra_imports_lightkube_or_httpx2() -> None:
    gone = {"lightkube", "httpx2", "httpx", "h2", "httpcore2", "httpcore"}
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for name in _imports(path)
        if name.split(".")[0] in gone
    ]
    assert not wrong, "the old apiserver client imported:\n" + "\n".join(wrong)


def test_only_the_kube_layer_imports_the_apiservers_client() -> None:
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] != "kube"
        for name in _imports(path)
        if name.split(".")[0] == "aiohttp" or name == "cnidra.kube.session"
    ]
    assert not wrong, "aiohttp imported outside cnidra/kube:\n" + "\n".join(wrong)


@pytest.mark.parametrize(
    ("code", "message", "kind"),
    [
        (None, "", Transient),  # no answer: the connection, a timeout
        (429, "", Transient),
        (500, "storage is (re)initializing", Transient),
        (502, "", Transient),
        (503, "", Transient),
        (504, "", Transient),
        (404, "not found", NotFound),
        (422, "invalid", Invalid),
        (409, "the object has been modified", Conflict),
        (409, 'cnipblocks "b" already exists', Conflict),
        (
            409,
            "Precondition failed: UID in precondition: a, UID in object meta: b",
            UidPrecondition,
        ),
        (400, "", RefusedForGood),
        (403, "forbidden", RefusedForGood),
        (405, "", RefusedForGood),
        (410, "", RefusedForGood),
        (413, "", RefusedForGood),
        (415, "", RefusedForGood),
        (401, "", ApiFailure),  # none of the kinds: neither retried nor dropped
        (501, "", ApiFailure),
    ],
)
def test_the_one_classifier(code: int | None, message: str, kind: type[ApiFailure]) -> None:
    assert classify(code, message) is kind


def test_the_kinds_nest_as_their_callers_read_them() -> None:
    assert issubclass(NotFound, RefusedForGood) and issubclass(Invalid, RefusedForGood)
    assert issubclass(UidPrecondition, Conflict) and issubclass(UidPrecondition, RefusedForGood)
    assert not issubclass(Conflict, RefusedForGood)
    assert not issubclass(Transient, RefusedForGood)


def test_the_apiservers_answers_and_transport_failures_are_translated() -> None:
    throttled = ApiStatus(429, "throttled", 3.0)
    failure = api_failure(throttled)
    assert isinstance(failure, Transient) and failure.retry_after == 3.0
    assert is_transient(throttled) and retry_after(throttled) == 3.0
    assert isinstance(api_failure(ConnectionResetError("reset")), Transient)
    assert isinstance(api_failure(TimeoutError()), Transient)
    assert api_failure(ValueError("a bug")) is None
    assert isinstance(api_failure(ApiStatus(None, "ClientConnectorError")), Transient)
    assert not is_transient(ApiStatus(403, "forbidden"))


class Client:
    def __init__(self, error: BaseException | None = None, hang: bool = False) -> None:
        self.error = error
        self.hang = hang

    async def get(self, kind: Any, name: str, **_: Any) -> str:
        if self.hang:
            await asyncio.sleep(3600)
        if self.error is not None:
            raise self.error
        return name

    async def delete(self, kind: Any, name: str, **_: Any) -> None:
        await self.get(kind, name)


async def test_get_or_none_and_delete_read_404_as_absent() -> None:
    gone = Api(Client(ApiStatus(404, "not found")))
    assert await gone.get_or_none("Pod", "p", "ns") is None
    assert await gone.delete("Pod", "p", "ns") is False
    with pytest.raises(NotFound):
        await gone.get("Pod", "p", "ns")
    assert await Api(Client()).get_or_none("Pod", "p") == "p"
    with pytest.raises(RefusedForGood, match="forbidden"):
        await Api(Client(ApiStatus(403, "forbidden"))).get_or_none("Pod", "p")


async def test_every_call_has_a_timeout() -> None:
    with pytest.raises(Transient, match="TimeoutError"):
        await Api(Client(hang=True), timeout=0.01).get("Pod", "p")


def test_the_webhooks_synchronous_reads_go_through_the_one_classifier() -> None:
    from cnidra.kube.api import get_or_none_sync, get_sync

    class Sync:
        def __init__(self, code: int) -> None:
            self.code = code

        def get(self, kind: Any, name: str) -> str:
            raise ApiStatus(self.code, "no")

    assert get_or_none_sync(Sync(404), "DeviceClass", "x") is None  # type: ignore[arg-type]
    with pytest.raises(RefusedForGood):
        get_sync(Sync(403), "Namespace", "x")  # type: ignore[arg-type]
    with pytest.raises(Transient):
        get_or_none_sync(Sync(503), "DeviceClass", "x")  # type: ignore[arg-type]
