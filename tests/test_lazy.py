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


def test_the_driver_loads_no_pyroute2() -> None:
    """The links are read by cnidra.inventory.netlink, and cnidra.datapath.shaping imports
    pyroute2 only when it first shapes: starting the driver loads none of it."""
    out = run(
        """
        import sys
        import cnidra.agent.driver
        import cnidra.inventory.links
        import cnidra.datapath.shaping
        print(sorted(m for m in sys.modules if m.startswith("pyroute2")))
        """
    )
    assert out.strip() == "[]"


def test_exported_names_come_from_their_submodules_and_the_rest_still_runs_the_init(
    tmp_path: Path,
) -> None:
    pkg = tmp_path / "served"
    (pkg / "lifespan").mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import sys\nsys.stdout.write('init ran\\n')\nfrom served.config import Config\n"
        "from served.main import run\n"
    )
    (pkg / "config.py").write_text("class Config:\n    pass\n")
    (pkg / "main.py").write_text("def run():\n    return 'ran'\n")
    (pkg / "lifespan" / "__init__.py").write_text("")
    (pkg / "lifespan" / "off.py").write_text("from served import Config\n")  # as uvicorn's does
    out = run(
        """
        from cnidra.util.lazy import defer_init
        assert defer_init("served", {"Config": "config"})
        from served.lifespan.off import Config
        import served.config
        print("imported", Config is served.config.Config)
        import served
        print(served.run(), served.Config is Config)
        """,
        tmp_path,
    )
    assert out.split("\n")[:3] == ["imported True", "init ran", "ran True"]


def test_the_driver_started_by_the_cli_loads_no_rich_no_test_framework_no_uvicorn_cli() -> None:
    """`cnidra driver` imports the CLI, then the driver; serving /healthz and /metrics and
    reading the links (its steady path) leave out what only other commands or libraries' other
    uses need: rich (the CLI's printing), unittest's framework, and
    uvicorn's command line (click, its reloaders). Each still loads when something asks."""
    out = run(
        """
        import contextlib, sys, urllib.request
        import cnidra.cli.main
        import cnidra.agent.driver
        from cnidra.inventory.links import read_links
        from cnidra.observe import http

        with contextlib.suppress(OSError):  # no netlink here: the imports are what is checked
            read_links()
        endpoint = http.HTTPEndpoint("127.0.0.1:0", lambda: (True, {}))
        endpoint.start()
        try:
            for path in ("/healthz", "/metrics"):
                url = f"http://127.0.0.1:{endpoint.port}{path}"
                urllib.request.urlopen(url, timeout=10).read()
        finally:
            endpoint.stop()
        unwanted = ("rich", "click", "uvicorn.main", "unittest.case", "unittest.main", "argparse")
        print([m for m in unwanted if m in sys.modules])
        import unittest
        import uvicorn
        from rich.console import Console
        print(callable(uvicorn.run), uvicorn.Config is http.Config, uvicorn.Server is http.Server)
        print(unittest.TestCase.__name__, Console.__name__)
        """
    )  # uvicorn.run first: its __init__, run then, binds the same Config and Server
    assert out.strip().split("\n") == ["[]", "True True True", "TestCase Console"]


def test_the_driver_loads_no_jsonschema_until_a_network_is_validated() -> None:
    """jsonschema (and referencing, rpds) validates a network a claim or class embeds; the
    driver at rest holds none of it (about 3 MiB of RSS), and the first validation loads it."""
    out = run(
        """
        import sys
        import cnidra.agent.driver
        from cnidra.api.issues import ROOT, Issues
        from cnidra.api.netconf import validate_network_config

        schema = ("jsonschema", "referencing", "rpds")
        print(sorted(m for m in sys.modules if m.split(".")[0] in schema))
        issues = Issues()
        config = {"cniVersion": "1.0.0", "name": "n", "type": "macvlan", "mtu": 12}
        validate_network_config(config, ROOT, issues, complete=True)
        print(issues.error_count, "jsonschema" in sys.modules)
        """
    )
    lines = out.strip().split("\n")
    assert lines[0] == "[]"
    assert lines[1] == "1 True"  # the mtu's format, checked by the lazily made checker
