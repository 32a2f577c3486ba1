"""cnidra's own .proto files against the upstream releases they were written from
(cnidra/_proto/README.md): every message and field cnidra declares exists upstream with the same
number, type and label, and every RPC with the same request and response. The upstream files are
fetched from the Go module proxy into Go's module cache (network on the first run only)."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import google.rpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

ROOT = Path(__file__).parents[2]
PROTO = ROOT / "cnidra" / "_proto"

# ours -> (module@version, file in the module, proto import root inside the module)
UPSTREAM = {
    "dra/v1/api.proto": ("k8s.io/kubelet@v0.37.2", "pkg/apis/dra/v1/api.proto"),
    "pluginregistration/v1/api.proto": (
        "k8s.io/kubelet@v0.37.2",
        "pkg/apis/pluginregistration/v1/api.proto",
    ),
    "nri/v1alpha1/api.proto": ("github.com/containerd/nri@v0.12.3", "pkg/api/api.proto"),
    "drahealth/v1alpha1/api.proto": (
        "k8s.io/kubelet@v0.37.2",
        "pkg/apis/dra-health/v1alpha1/api.proto",
    ),
    "ttrpc/ttrpc.proto": ("github.com/containerd/ttrpc@v1.2.9", "request.proto"),
}


def module_dir(module: str) -> Path:
    out = subprocess.run(
        ["go", "mod", "download", "-json", module],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tempfile.gettempdir(),
    ).stdout
    return Path(json.loads(out)["Dir"])


# messages cnidra inlines instead of importing: ours -> upstream full name
INLINED = {"ttrpc.Status": "google.rpc.Status", "ttrpc.Any": "google.protobuf.Any"}


def descriptors(include: Path, file: str) -> descriptor_pb2.FileDescriptorSet:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        well_known = Path(protoc.__file__).parent / "_proto"
        # google/rpc/status.proto (googleapis-common-protos), which ttrpc's request.proto imports
        googleapis = Path(next(iter(google.rpc.__path__))).parents[1]
        code = protoc.main(
            [
                "protoc",
                f"-I{include}",
                f"-I{well_known}",
                f"-I{googleapis}",
                "--include_imports",
                f"--descriptor_set_out={out}",
                str(include / file),
            ]
        )
        assert code == 0, f"protoc failed on {include / file}"
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def main_file(
    fds: descriptor_pb2.FileDescriptorSet, file: str
) -> descriptor_pb2.FileDescriptorProto:
    [fd] = [f for f in fds.file if f.name == file]
    return fd


def messages(
    files: list[descriptor_pb2.FileDescriptorProto],
) -> dict[str, descriptor_pb2.DescriptorProto]:
    """Every message by full name (package.Outer.Inner)."""
    found: dict[str, descriptor_pb2.DescriptorProto] = {}

    def walk(prefix: str, items: list[descriptor_pb2.DescriptorProto]) -> None:
        for m in items:
            found[f"{prefix}{m.name}"] = m
            walk(f"{prefix}{m.name}.", list(m.nested_type))

    for fd in files:
        walk(f"{fd.package}.", list(fd.message_type))
    return found


def short(type_name: str) -> str:
    return type_name.rsplit(".", 1)[-1]


@pytest.mark.parametrize("ours", sorted(UPSTREAM))
def test_our_protos_match_the_upstream_release(ours: str) -> None:
    module, file = UPSTREAM[ours]
    their_set = descriptors(module_dir(module), file)
    theirs = main_file(their_set, file)
    mine = main_file(descriptors(PROTO, ours), ours)
    assert mine.package == theirs.package
    upstream = messages(list(their_set.file))
    problems = []
    for own_name, message in messages([mine]).items():
        name = INLINED.get(own_name, own_name)
        if name not in upstream:
            problems.append(f"message {name} is not upstream")
            continue
        fields = {f.name: f for f in upstream[name].field}
        for field in message.field:
            them = fields.get(field.name)
            if them is None:
                problems.append(f"{name}.{field.name} is not upstream")
            elif (field.number, field.type, field.label, short(field.type_name)) != (
                them.number,
                them.type,
                them.label,
                short(them.type_name),
            ):
                problems.append(f"{name}.{field.name}: ours {field} upstream {them}")
    services = {s.name: {m.name: m for m in s.method} for s in theirs.service}
    for service in mine.service:
        for method in service.method:
            them = services.get(service.name, {}).get(method.name)
            if them is None:
                problems.append(f"rpc {service.name}.{method.name} is not upstream")
            elif (short(method.input_type), short(method.output_type)) != (
                short(them.input_type),
                short(them.output_type),
            ):
                problems.append(f"rpc {service.name}.{method.name} has other types upstream")
    assert not problems, "\n".join(problems)


def test_health_v1_is_v1alpha1_in_another_package() -> None:
    """cnidra serves kubelet 1.37's v1.DRAResourceHealth with its v1alpha1 messages: upstream's
    two files must differ in nothing but the package."""
    root = module_dir("k8s.io/kubelet@v0.37.2")
    files = {
        version: main_file(
            descriptors(root, f"pkg/apis/dra-health/{version}/api.proto"),
            f"pkg/apis/dra-health/{version}/api.proto",
        )
        for version in ("v1", "v1alpha1")
    }
    for fd in files.values():
        fd.ClearField("name")
        fd.ClearField("package")
        fd.ClearField("options")
        for message in fd.message_type:
            for field in message.field:
                if field.type_name:
                    field.type_name = short(field.type_name)
        for service in fd.service:
            for method in service.method:
                method.input_type = short(method.input_type)
                method.output_type = short(method.output_type)
    assert files["v1"] == files["v1alpha1"]
