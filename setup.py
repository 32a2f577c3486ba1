"""The one build step pyproject.toml cannot say: generating the protobuf modules from
cnidra's .proto files into the build, so a wheel or an sdist install works without the Makefile
(the generated code is build output and never committed)."""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithProtos(build_py):
    def run(self) -> None:
        super().run()
        from grpc_tools import protoc  # a build requirement (pyproject.toml)

        root = Path(__file__).parent
        protos = sorted(str(p) for p in (root / "cnidra" / "_proto").rglob("*.proto"))
        out = self.build_lib
        code = protoc.main(["protoc", f"-I{root}", f"--python_out={out}", *protos])
        if code != 0:
            raise RuntimeError(f"protoc failed ({code}) on {protos}")


setup(cmdclass={"build_py": BuildWithProtos})
