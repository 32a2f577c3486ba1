"""docs/architecture.md against the code: the claims of the doc a program can check, checked
without running the driver (no root, no test bed). Module paths and names the doc cites exist;
the layers it draws are tests/test_layers.py's; the Supervisor's tasks, the watches, the HTTP
servers, the stores' fsyncs, the commands, flags and constants it names are the code's."""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from tests.test_layers import LAYERS, imports

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "cnidra"
DOC_TEXT = (ROOT / "docs" / "architecture.md").read_text()
DOC = re.sub(r"\s+", " ", DOC_TEXT)  # prose with its line breaks undone
# the test code the doc cites: the test bed's harness and the state machine's fakes
TEST_CODE = [*sorted((ROOT / "testbed").glob("*.py")), ROOT / "tests" / "nri" / "fakes.py"]
PACKAGES = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
WORDS = {
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "thirteen": 13,
}
# names the doc cites that other projects define: containerd/nri's, uvicorn's
EXTERNAL = {"Adaptation", "Config", "Server"}


def code(path: str) -> str:
    return (ROOT / path).read_text()


@cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def tree(path: str) -> ast.Module:
    return parsed(ROOT / path)


def constant(path: str, name: str) -> object:
    """A module-level constant, read from the source (the module is not imported)."""
    for node in tree(path).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            assert node.value is not None
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path} has no constant {name}")


def spans(text: str | None = None) -> list[str]:
    return re.findall(r"`([^`\n]+)`", DOC_TEXT if text is None else text)


def rows() -> dict[str, str]:
    """The package table: `cnidra/<package>` -> its row."""
    found = {}
    for match in re.finditer(r"^\| `cnidra/(\w+)` \|(.*?)\|\s*$", DOC_TEXT, re.M | re.S):
        found[match.group(1)] = match.group(2)
    return found


def diagram() -> list[str]:
    return DOC_TEXT.split("```\n", 2)[1].split("```", 1)[0].splitlines()


def diagram_layers() -> dict[int, str]:
    """Layer number -> its lines of the drawing, joined."""
    layers: dict[int, list[str]] = {}
    current = None
    for line in diagram():
        start = re.match(r"^ (\d)  ", line)
        if start:
            current = int(start.group(1))
            layers[current] = [line[len(start.group(0)) :]]
        elif current is not None:
            layers[current].append(line)
    return {n: " ".join(lines) for n, lines in layers.items()}


def without_parentheses(text: str) -> str:
    while True:
        shorter = re.sub(r"\([^()]*\)", " ", text)
        if shorter == text:
            return text
        text = shorter


def python_files() -> Iterator[Path]:
    """cnidra's modules, not the generated protobuf code (never committed)."""
    yield from (p for p in sorted(PACKAGE.rglob("*.py")) if "_pb2" not in p.name)


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


# ------------------------------------------------------------------ the layers


def test_the_drawing_has_test_layers_layers() -> None:
    drawn = diagram_layers()
    assert sorted(drawn) == list(range(len(LAYERS))), "one line per layer, numbered from 0"
    for number, text in drawn.items():
        names = set(re.split(r"[\s·─┘┤│◄▲]+", without_parentheses(text)))
        assert names & PACKAGES == LAYERS[number], f"layer {number} as drawn: {text}"


def test_the_drawing_names_modules_of_its_layer() -> None:
    for number, text in diagram_layers().items():
        for module in re.findall(r"\b(\w+\.py)\b", text):
            assert any((PACKAGE / pkg / module).exists() for pkg in LAYERS[number]), module


def test_the_table_has_every_package_once() -> None:
    assert set(rows()) == PACKAGES
    assert len(re.findall(r"^\| `cnidra/\w+` \|", DOC_TEXT, re.M)) == len(PACKAGES)


def test_the_rule_is_what_test_layers_checks(tmp_path: Path) -> None:
    """Lazy imports count; relative ones escape (and the code has none)."""
    module = tmp_path / "module.py"
    module.write_text("def f():\n    import cnidra.dra.prepare\n\nfrom ..nri import hooks\n")
    assert imports(module) == {"dra"}
    assert "lazy imports included" in DOC and "a relative import (the code has none)" in DOC
    relative = [
        p
        for p in python_files()
        if any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(parsed(p)))
    ]
    assert not relative, relative


# ------------------------------------------------------------------ what the doc names


def is_path(token: str) -> bool:
    if re.search(r"\s|<|=|^[/.-]|\.io/|…", token):
        return False
    return "/" in token or bool(re.search(r"\.(py|md|json|sh|proto|yaml)$", token))


def exists(token: str, bases: list[Path]) -> bool:
    return any(any(base.glob(token.rstrip("/"))) for base in bases)


def test_every_path_the_doc_names_exists() -> None:
    table = rows()
    missing = []
    for package, row in table.items():
        for token in filter(is_path, spans(row)):
            if "/" in token:
                bases = [PACKAGE / package, PACKAGE, ROOT, PACKAGE / "_proto"]
            else:  # a bare module name is its row's package's
                bases = [PACKAGE / package, ROOT]
            if not exists(token, bases):
                missing.append(f"{token} (row cnidra/{package})")
    rest = DOC_TEXT
    for row in table.values():
        rest = rest.replace(row, "")
    for token in filter(is_path, spans(rest)):
        bases = [ROOT, PACKAGE] if "/" in token else [ROOT, *ROOT.glob("*/"), *PACKAGE.glob("*/")]
        if not exists(token, bases):
            missing.append(token)
    for doc in re.findall(r"\bdocs/[\w/-]+\.md\b", DOC_TEXT):
        if not (ROOT / doc).exists():
            missing.append(doc)
    assert not missing, missing


@cache
def module_of(dotted: str) -> tuple[Path, list[str]] | None:
    """The longest prefix of `dotted` that is a module of cnidra, and the rest."""
    parts = dotted.split(".")
    for i in range(len(parts), 1, -1):
        base = ROOT.joinpath(*parts[:i])
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.exists():
                return path, parts[i:]
    return None


def defined(path: Path) -> set[str]:
    names = set()
    for node in parsed(path).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_every_dotted_module_and_name_exists() -> None:
    protos = " ".join(p.read_text() for p in PACKAGE.rglob("*.proto"))
    wrong = []
    for span in set(spans()):
        token = span.removesuffix("'s")
        if not re.fullmatch(r"[a-z_]\w*(\.\w+)+", token) or is_path(token):
            continue
        if token.split(".")[0] != "cnidra":  # `status.devices`, a chart value: not a module
            continue
        found = module_of(token)
        if found is None:
            if f"package {token};" not in protos:  # a protobuf package, such as the node API's
                wrong.append(token)
            continue
        path, rest = found
        if rest and rest[0] not in defined(path):
            wrong.append(token)
    assert not wrong, wrong


@cache
def classes() -> dict[str, set[str]]:
    """Every class of cnidra and the cited test code -> the names of its members."""
    out: dict[str, set[str]] = {}
    for path in [*python_files(), *TEST_CODE]:
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ClassDef):
                members = out.setdefault(node.name, set())
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        members.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        members.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        members.update(t.id for t in item.targets if isinstance(t, ast.Name))
    return out


@cache
def definitions() -> set[str]:
    """Every class, function and module constant of cnidra and the cited test code, and every
    RPC and message of its .proto files."""
    names = set(classes())
    for path in [*python_files(), *TEST_CODE]:
        names |= defined(path)
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
    for proto in PACKAGE.rglob("*.proto"):
        names.update(re.findall(r"^\s*(?:rpc|message)\s+(\w+)", proto.read_text(), re.M))
    return names


@cache
def every_word() -> set[str]:
    files = [*python_files(), *TEST_CODE]
    return {w for path in files for w in re.findall(r"\w+", path.read_text())}


def test_every_class_member_the_doc_names_exists() -> None:
    wrong = []
    for token in set(spans()):
        match = re.fullmatch(r"([A-Z]\w*)\.(\w+)", token)
        if match and match.group(2) not in classes().get(match.group(1), set()):
            wrong.append(token)
    assert not wrong, wrong


def test_every_identifier_the_doc_names_is_defined() -> None:
    """A class, function, RPC or constant the doc names in backticks is cnidra's (or a cited
    test's), unless it is another project's; a `CNIDRA_*` variable is one the code reads."""
    wrong = []
    for token in set(spans()):
        if not re.fullmatch(r"[A-Za-z_]\w*", token):
            continue
        if re.fullmatch(r"CNIDRA_[A-Z_]+", token):
            if token not in every_word():
                wrong.append(token)
        elif (re.fullmatch(r"[A-Z]\w*[a-z]\w*", token) or "_" in token.strip("_")) and not (
            token in definitions() or token in EXTERNAL
        ):
            wrong.append(token)
    assert not wrong, wrong


# ------------------------------------------------------------------ tasks and threads


def spawned() -> list[tuple[str, bool]]:
    """(name, critical) of each task the agent gives its Supervisor."""
    out = []
    for node in ast.walk(tree("cnidra/agent/driver.py")):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "spawn"
            and isinstance(node.func.value, ast.Attribute)
            and node.func.value.attr == "tasks"
        ):
            first = node.args[0]
            assert isinstance(first, ast.Constant)
            critical = next((k.value for k in node.keywords if k.arg == "critical"), None)
            out.append((str(first.value), critical is None or ast.literal_eval(critical)))
    return out


def task_names() -> set[str]:
    """Names given to asyncio tasks anywhere in cnidra; an f-string's constant head + '<'."""
    names = set()
    for path in python_files():
        for node in ast.walk(parsed(path)):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "create_task"):
                continue
            for keyword in node.keywords:
                if keyword.arg != "name":
                    continue
                if isinstance(keyword.value, ast.Constant):
                    names.add(str(keyword.value.value))
                elif isinstance(keyword.value, ast.JoinedStr):
                    head = keyword.value.values[0]
                    if isinstance(head, ast.Constant):
                        names.add(f"{head.value}<")
    return names


def test_the_supervisors_tasks_are_the_ones_the_doc_lists() -> None:
    match = re.search(r"`Supervisor` runs (\w+) tasks: (.*?);", DOC)
    assert match, "the doc lists the Supervisor's tasks"
    listed = re.findall(r"`([^`]+)`", match.group(2))
    tasks = spawned()
    assert sorted(listed) == sorted(name for name, _ in tasks)
    assert WORDS[match.group(1)] == len(tasks)
    if "all are critical" in DOC:
        assert all(critical for _, critical in tasks)
    for name, critical in tasks:
        if not critical:
            assert f"`{name}`\n  excepted (not critical" in DOC_TEXT or f"`{name}` excepted" in DOC


def test_the_tasks_outside_the_supervisor_are_named_as_the_doc_says() -> None:
    section = DOC[DOC.index("The tasks they start are not supervised") :]
    section = section[: section.index(" - ")]
    named = {
        t.split("<")[0] + ("<" if "<" in t else "") for t in re.findall(r"`([\w<>-]+)`", section)
    }
    assert named, "the doc names the unsupervised tasks"
    assert named <= task_names(), named - task_names()
    assert not named & {name for name, _ in spawned()}


def test_the_threads_the_doc_names() -> None:
    started = set()
    for path in python_files():
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "Thread":
                for keyword in node.keywords:
                    if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                        started.add(keyword.value.value)
    # the HTTP endpoint's and the log level file's (the driver's); the webhook's and the
    # interface counters' reader exist too, outside the driver's long-lived ones
    assert {"http", "log-level-file"} <= started
    assert "the HTTP endpoint's and the log level file's" in DOC


# ------------------------------------------------------------------ servers and libraries


def test_http_is_served_by_uvicorn_not_the_standard_library() -> None:
    for path in ("cnidra/observe/http.py", "cnidra/admission/webhook.py"):
        assert any(m.split(".")[0] == "uvicorn" for m in imported_modules(ROOT / path)), path
    assert "BoundedServer" in code("cnidra/admission/webhook.py")
    stdlib_servers = {"http.server", "socketserver", "wsgiref", "wsgiref.simple_server"}
    users = [p for p in python_files() if imported_modules(p) & stdlib_servers]
    assert not users, users
    table = rows()
    assert "uvicorn" in table["observe"] and "uvicorn" in table["admission"]
    assert "no standard-library HTTP server" in DOC


def test_the_libraries_the_doc_names_are_used() -> None:
    named = {
        "pydantic": "pydantic",
        "jsonschema": "jsonschema",
        "PyYAML": "yaml",
        "typer": "typer",
        "rich": "rich",
        "grpclib": "grpclib",
        "aiohttp": "aiohttp",
        "prometheus_client": "prometheus_client",
        "uvicorn": "uvicorn",
    }
    sentence = DOC[DOC.index("Everything else uses well-kept libraries") :]
    used = {m.split(".")[0] for p in python_files() for m in imported_modules(p)}
    for name, module in named.items():
        assert name in sentence, name
        assert module in used, module
    # pyroute2: the tests' comparison with the hand-written dumps, and tc in cnidra/datapath
    pyroute2_users = {
        p.relative_to(PACKAGE).parts[0]
        for p in python_files()
        if any(m.split(".")[0] == "pyroute2" for m in imported_modules(p))
    }
    assert pyroute2_users <= {"datapath"}, pyroute2_users
    assert "through pyroute2" in rows()["datapath"]


# ------------------------------------------------------------------ the apiserver


def calls(path: str, method: str) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree(path))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == method
        and ("client" in ast.unparse(node.func.value) or "api" in ast.unparse(node.func.value))
        and path != "cnidra/kube/api.py"  # the one layer passes its callers' kinds on
    ]


def test_the_watches_are_cninetworks_the_nodes_pods_the_accountants_and_network_policys() -> None:
    watched = {}
    for path in python_files():
        rel = str(path.relative_to(ROOT))
        watched.update({ast.unparse(c.args[0]): rel for c in calls(rel, "watch")})
    assert watched == {
        "CNINetwork": "cnidra/kube/networks.py",
        "PodDocument": "cnidra/kube/pods.py",
        "CNIIPPool": "cnidra/kube/ipam.py",
        "CNIIPBlock": "cnidra/kube/ipam.py",
        "Event": "cnidra/kube/ipam.py",
        "resource": "cnidra/kube/netpolicy.py",
        "DeviceClass": "cnidra/kube/deviceclasses.py",
    }
    assert re.search(r"CNINetwork = cluster_wide\(", code("cnidra/kube/networks.py"))
    assert (
        "a cluster-wide watch of CNINetworks, one of the two cluster-wide watches every driver "
        "holds besides network policy's" in DOC
    )
    assert "DeviceClasses (`deviceclasses.py`: a LIST and a cluster-wide watch, the other" in DOC
    # the pods' watch is the node's own: its field selector is the node's name
    assert 'fields = {"spec.nodeName": self.node, "status.phase": "Pending"}' in code(
        "cnidra/kube/pods.py"
    )
    assert "the node-scoped watch kubelet itself uses" in DOC
    # the pool accountant's, held only by the driver that holds its Lease
    accountant = {ast.unparse(c.args[0]) for c in calls("cnidra/kube/ipam.py", "watch")}
    assert accountant == {"CNIIPPool", "CNIIPBlock", "Event"}
    assert "the three watches only the driver holding it keeps" in DOC
    # network policy's `resource` is each kind it needs
    assert "what network policy needs, each listed and then watched cluster-wide" in DOC
    assert "Claims are never watched" in DOC


def test_claims_py_reads_claims_and_namespaces_and_the_publisher_the_node() -> None:
    got = {ast.unparse(c.args[0]) for c in calls("cnidra/kube/claims.py", "get")}
    assert got == {"ClaimDocument", "Namespace"}
    assert "Node" in {ast.unparse(c.args[0]) for c in calls("cnidra/inventory/publisher.py", "get")}
    assert "the labels of the claim's namespace" in rows()["kube"]


def test_the_hook_path_and_the_node_api_never_ask_the_apiserver() -> None:
    """The NRI package and the node API import no apiserver client, and what the hooks hand the
    status writer (`StatusSink`) is recorded, not awaited."""
    for package in ("nri", "nodeapi"):
        for path in sorted((PACKAGE / package).glob("*.py")):
            assert not imports(path) & {"kube", "ipam", "inventory"}, path
            assert not {m.split(".")[0] for m in imported_modules(path)} & {"aiohttp"}
    (sink,) = (
        n
        for n in ast.walk(tree("cnidra/status/writer.py"))
        if isinstance(n, ast.ClassDef) and n.name == "StatusSink"
    )
    assert not [n.name for n in sink.body if isinstance(n, ast.AsyncFunctionDef)]
    assert "nothing on the NRI hook path waits for the apiserver" in DOC


def test_retries_serve_whom_the_doc_says() -> None:
    users = {
        str(p.relative_to(ROOT))
        for p in python_files()
        if "with_retries" in p.read_text() and p.name != "client.py"
    }
    assert users == {"cnidra/kube/ipam.py"}
    assert "with_retries(" in code("cnidra/kube/client.py").split("def probe_features")[1]
    assert "with_retries" not in code("cnidra/kube/claims.py")


def test_the_status_writer_is_as_the_doc_says() -> None:
    assert constant("cnidra/api/constants.py", "DRIVER_NAME") + "/interfaces" in DOC
    assert f"field manager `{constant('cnidra/status/claimstatus.py', 'STATUS_MANAGER')}`" in DOC
    assert f"field manager `{constant('cnidra/status/claimstatus.py', 'FINALIZER_MANAGER')}`" in DOC
    from cnidra.kube.api import RefusedForGood, classify

    codes = tuple(c for c in range(400, 600) if issubclass(classify(c), RefusedForGood))
    listed = re.search(r"refuses for good \(([\d, ]+), or a 409", DOC)
    assert listed and tuple(int(c) for c in listed.group(1).split(", ")) == codes
    flush = constant("cnidra/agent/driver.py", "STATUS_FLUSH_SECONDS")
    assert f"flushes the queue for at most {flush:g} s" in DOC


# ------------------------------------------------------------------ state on disk


def test_what_is_fsynced_is_what_the_doc_says(tmp_path: Path) -> None:
    from cnidra.state.checkpoint import Checkpoint
    from cnidra.state.ipam import IPAMState
    from cnidra.state.layout import StateLayout
    from cnidra.state.sandboxes import SandboxStore

    layout = StateLayout(tmp_path)
    assert Checkpoint(layout).durable
    ipam = IPAMState(layout)
    assert ipam.blocks.durable and ipam.leases.durable
    assert not SandboxStore(layout).durable
    functions = {
        n.name: ast.unparse(n)
        for n in ast.walk(tree("cnidra/state/store.py"))
        if isinstance(n, ast.AsyncFunctionDef)
    }
    # the durable writes, off the loop (grouped: one hop and one fsync for concurrent ones)
    assert "self._commit(" in functions["put"]
    assert "asyncio.to_thread" in functions["_write_groups"]
    cached = [
        ast.unparse(c) for c in ast.walk(tree("cnidra/cni/cache.py")) if isinstance(c, ast.Call)
    ]
    assert any(c.startswith("write_atomically(") and "durable=False" in c for c in cached)
    state = rows()["state"]
    assert "`checkpoint.py`, fsynced" in state and "not fsynced" in state


# ------------------------------------------------------------------ commands, flags, numbers


@cache
def cli_commands() -> dict[str, list[object]]:
    """Every `cnidra` command (subcommands as "node pods") -> its click parameters."""
    import typer.main

    from cnidra.cli.main import app

    out: dict[str, list[object]] = {}

    def walk(command: object, prefix: str) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands:
            for name, sub in subcommands.items():
                walk(sub, f"{prefix} {name}".strip())
        else:
            out[prefix] = list(getattr(command, "params", []))

    walk(typer.main.get_command(app), "")
    return out


def test_the_commands_the_doc_draws_and_lists() -> None:
    top = {name.split()[0] for name in cli_commands()}
    line = next(text for n, text in diagram_layers().items() if n == len(LAYERS) - 1)
    drawn = {w.strip() for w in line.removeprefix("cli").split("·")}
    assert drawn == top
    assert top <= set(spans(rows()["cli"]))


def options(command: str) -> dict[str, object]:
    return {
        opt: param
        for param in cli_commands()[command]
        for opt in [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]
    }


def test_every_flag_the_doc_names_is_a_flag() -> None:
    every = {opt for command in cli_commands() for opt in options(command)}
    named = {t.split("=")[0] for t in spans() if t.startswith("--")}
    assert named and named <= every, named - every


def test_the_driver_settings_other_commands_declare_again() -> None:
    """The doc names each flag another command declares with a driver setting's variable."""
    from cnidra.agent.settings import DEFAULTS, LogSettings

    logs = {f.name for f in dataclasses.fields(LogSettings)}
    driver = {
        param.envvar: opt
        for opt, param in options("driver").items()
        if getattr(param, "envvar", None) and param.name not in logs  # type: ignore[attr-defined]
    }
    again = set()
    for command in cli_commands():
        if command == "driver":
            continue
        for opt, param in options(command).items():
            if getattr(param, "envvar", None) in driver:
                again.add((command, opt))
    agent = rows()["agent"]
    for command, opt in again:
        assert f"`{opt}`" in agent and command in agent, (command, opt)
    try_path = options("try")["--cni-path"].default  # type: ignore[attr-defined]
    assert f"`{try_path}`" in agent and f"`{':'.join(DEFAULTS.cni_path)}`" in agent
    assert f"{DEFAULTS.http_address} by default" in DOC


def test_the_numbers_the_doc_gives() -> None:
    slots = constant("cnidra/dra/prepare.py", "APISERVER_SLOTS")
    judges = constant("cnidra/dra/prepare.py", "JUDGE_SLOTS")
    budget = constant("cnidra/dra/prepare.py", "JUDGE_BUDGET_S")
    share = constant("cnidra/nri/budget.py", "ATTACH_SHARE")
    assert isinstance(judges, int) and isinstance(budget, float) and isinstance(share, float)
    number = {v: k for k, v in WORDS.items()}[judges]
    assert f"at most {slots} at once" in DOC
    assert f"({number} claims at once, {budget:g} s each)" in DOC
    assert f"a share of it ({round(share * 100)} %)" in DOC
