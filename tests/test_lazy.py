"""cnidra.util.lazy: a package's __init__ deferred until a name only it defines is asked for."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def run(code: str, path: Path | None = None) -> str:
    env_path = [str(path)] if path else []
    prelude = f"import sys; sys.path[:0] = {env_path!r}\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout


def test_submodules_import_without_the_init_and_other_names_run_it(tmp_path: Path) -> None:
    pkg = tmp_path / "heavy"
    (pkg / "part").mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import sys\nsys.stdout.write('init ran\\n')\nfrom heavy.part.inner import Thing\n"
        "EXTRA = 42\n"
    )
    (pkg / "part" / "__init__.py").write_text("from heavy import config\n")
    (pkg / "part" / "inner.py").write_text("class Thing:\n    pass\n")
    (pkg / "config.py").write_text("VALUE = 1\n")
    out = run(
        """
        from cnidra.util.lazy import defer_init
        assert defer_init("heavy")
        from heavy.part.inner import Thing  # a submodule, and `from heavy import config` in it
        print("imported")
        import heavy
        print(heavy.EXTRA, heavy.Thing is Thing)  # a name of the package's own: __init__ runs
        assert not defer_init("heavy")
        """,
        tmp_path,
    )
    assert out.split("\n")[:3] == ["imported", "init ran", "42 True"]


def test_the_driver_loads_pyroute2s_iproute_alone_and_the_rest_on_demand() -> None:
    out = run(
        """
        import sys
        import cnidra.agent.driver
        from cnidra.inventory.links import IPRoute
        print(sorted({m.split(".")[1] for m in sys.modules if m.startswith("pyroute2.")}))
        from pyroute2 import IPRoute as Public, NetNS
        print(Public is IPRoute, "pyroute2.conntrack" in sys.modules)
        """
    )
    loaded, after = out.strip().split("\n")
    assert "conntrack" not in loaded and "ethtool" not in loaded and "ndb" not in loaded
    assert "iproute" in loaded
    assert after == "True True"
