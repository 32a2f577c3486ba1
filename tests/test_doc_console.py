"""The doc-test harness (issue 41): every ```console block of README.md and docs/*.md is either
run from its own text or says which test backs it, so a doc cannot drift from the tool.

A block's commands are its lines that start with a prompt (`$ ` or `# `); the lines after a
command, up to the next one, are what it prints (stdout and stderr as a terminal shows them:
one stream, unbuffered). A block is run when every command is `cnidra ...` (or `kubectl
cnidra ...` with --help, which needs no cluster) with no shell syntax: each command is run from
the repository root, in order, and the whole output compared with the block. Blocks with
`cnidra try` need root and network namespaces: they run in `test_a_try_block_is_what_try_prints`
(marked netns), from a namespace standing in for the machine and a TMPDIR of their own, with
this run's netns tag (tests/conftest.py RUN_TAG), so parallel runs never share a name.

Any other block (a cluster's `kubectl`, the node API's `cnidra node`, an excerpt of an Event)
must carry, on the line before its fence, a marker naming the test that backs what it shows:

    <!-- doc-test: needs a cluster (tests/testbed/test_lifecycle.py::test_name) -->

The named file must exist and define that test; an unmarked block the harness cannot run
fails, and so does a marker on a block it could run.

What changes from run to run is normalised, the same way in the doc and in the output, and
nothing else: MAC addresses (numbered in order of appearance, so one MAC shown twice must be
the same MAC twice), the names of try's network namespaces (`cnidra-try-pod-...`, whose
suffix is random and carries the run's tag), RFC 3339 timestamps (a condition's
`lastTransitionTime`), and whitespace at the end of a line (Markdown editors strip it).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cnidra.cni import netns
from tests.conftest import ROOT, RUN_TAG, CNITools

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```console[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
MARKER = re.compile(r"<!--\s*doc-test:(.*?)-->\s*\Z", re.S)
BACKING = re.compile(r"(tests/[\w/]+\.py)::(test_\w+)")
PROMPT = re.compile(r"^[$#] ")
SHELL_SYNTAX = re.compile(r"[|;&<>`]|\$\(")
# cnidra's subcommands that read files and need no cluster, no driver and no root
OFFLINE = {"validate", "convert", "--version", "--help"}


@dataclass(frozen=True)
class Step:
    command: str
    shown: str  # what the doc says it prints


@dataclass(frozen=True)
class Block:
    doc: str  # relative to the repository root
    line: int  # of the opening fence
    text: str
    marker: str | None
    steps: tuple[Step, ...]

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def tries(self) -> bool:
        return any(argv(s.command)[1:2] == ["try"] for s in self.steps if runnable(s.command))


def parse(text: str) -> tuple[Step, ...]:
    steps: list[Step] = []
    command: str | None = None
    shown: list[str] = []
    for line in text.splitlines(keepends=True):
        if PROMPT.match(line):
            if command is not None:
                steps.append(Step(command, "".join(shown)))
            command, shown = line[2:].strip(), []
        else:
            shown.append(line)
    if command is not None:
        steps.append(Step(command, "".join(shown)))
    return tuple(steps)


def blocks() -> list[Block]:
    found = []
    for path in DOCS:
        text = path.read_text()
        for match in FENCE.finditer(text):
            before = MARKER.search(text[: match.start()])
            found.append(
                Block(
                    doc=str(path.relative_to(ROOT)),
                    line=text.count("\n", 0, match.start()) + 1,
                    text=match.group(1),
                    marker=before.group(1).strip() if before else None,
                    steps=parse(match.group(1)),
                )
            )
    return found


def argv(command: str) -> list[str]:
    """`cnidra ...` as `cnidra ...`, `kubectl cnidra ...` as the kubectl-cnidra plugin."""
    words = shlex.split(command)
    if words[:2] == ["kubectl", "cnidra"]:
        return ["kubectl-cnidra", *words[2:]]
    return words


def runnable(command: str) -> bool:
    """A command the harness runs here: no cluster, no driver, no shell."""
    if SHELL_SYNTAX.search(command):
        return False
    words = argv(command)
    if words[:1] == ["kubectl-cnidra"]:
        return "--help" in words or "-h" in words
    if words[:1] != ["cnidra"] or len(words) < 2:
        return False
    return words[1] in OFFLINE or words[1] == "try" or "--help" in words


def executable(words: list[str]) -> list[str]:
    if words[0] == "kubectl-cnidra":
        return [str(Path(sys.executable).parent / "kubectl-cnidra"), *words[1:]]
    return [sys.executable, "-m", "cnidra", *words[1:]]


def normalise(text: str) -> str:
    macs: dict[str, str] = {}

    def mac(match: re.Match[str]) -> str:
        return macs.setdefault(match.group(0).lower(), f"<mac{len(macs) + 1}>")

    text = re.sub(r"\b(?:[0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}\b", mac, text)
    text = re.sub(r"\b(cnidra-try-(?:pod|node))-(?:[A-Za-z0-9]+-)?[0-9a-f]{10}\b", r"\1-<id>", text)
    text = re.sub(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)", "<time>", text)
    return "\n".join(line.rstrip() for line in text.split("\n"))


def run(block: Block, env: dict[str, str], prefix: tuple[str, ...] = ()) -> tuple[str, str]:
    """(what the doc shows, what the commands print), both normalised."""
    shown, printed = [], []
    for step in block.steps:
        words = argv(step.command)
        ran = subprocess.run(
            [*prefix, *executable(words)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=180, check=False,
        )  # fmt: skip
        # 0 or 1 (validate's verdict on an invalid example): never a usage error or a crash
        assert ran.returncode in (0, 1), f"$ {step.command}: exit {ran.returncode}\n{ran.stdout}"
        assert "Traceback" not in ran.stdout, ran.stdout
        shown.append(f"$ {step.command}\n{step.shown}")
        printed.append(f"$ {step.command}\n{ran.stdout}")
    return normalise("".join(shown)), normalise("".join(printed))


def terminal_env() -> dict[str, str]:
    """stdout and stderr in the order a terminal shows them; help at a terminal's width."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "80", "TERM": "dumb",
            "NO_COLOR": "1"}  # fmt: skip


ALL = blocks()
MARKED = [b for b in ALL if b.marker is not None]
# an unmarked block the harness cannot run fails the test above, and is not run
RUNNABLE = [
    b for b in ALL if b.marker is None and b.steps and all(runnable(s.command) for s in b.steps)
]
RUN = [b for b in RUNNABLE if not b.tries]
TRIES = [b for b in RUNNABLE if b.tries]


def test_the_harness_finds_the_docs_console_blocks() -> None:
    """A fence it does not see is a block it does not check."""
    fences = sum(p.read_text().count("```console") for p in DOCS)
    assert len(ALL) == fences
    assert RUN and TRIES and MARKED


@pytest.mark.parametrize("block", ALL, ids=lambda b: b.id)
def test_every_console_block_is_run_or_names_its_backing_test(block: Block) -> None:
    if block.marker is None:
        cannot = [s.command for s in block.steps if not runnable(s.command)]
        assert block.steps and not cannot, (
            f"{block.id}: the harness cannot run {cannot or 'a block without a command'}; "
            "run it from the doc's text, or put a marker on the line before the fence: "
            "<!-- doc-test: why (tests/PATH.py::test_NAME) -->"
        )
        return
    backing = BACKING.findall(block.marker)
    assert backing, f"{block.id}: the marker names no test (tests/PATH.py::test_NAME)"
    for path, name in backing:
        source = ROOT / path
        assert source.is_file(), f"{block.id}: {path} does not exist"
        assert re.search(rf"^(?:async )?def {name}\(", source.read_text(), re.M), (
            f"{block.id}: {path} has no {name}"
        )
    assert not block.steps or not all(runnable(s.command) for s in block.steps), (
        f"{block.id}: the harness can run this block: drop the marker"
    )


@pytest.mark.parametrize("block", RUN, ids=lambda b: b.id)
def test_a_console_block_is_what_its_commands_print(block: Block) -> None:
    shown, printed = run(block, terminal_env())
    assert printed == shown


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Path]:
    """try's scratch directories in a TMPDIR of the test's own, run from a namespace standing
    in for the machine (tests/cni/test_try.py does the same): nothing of another run's seen."""
    with netns.temporary("cnidra-machine") as path:
        yield path


@pytest.mark.netns
@pytest.mark.parametrize("block", TRIES, ids=lambda b: b.id)
def test_a_try_block_is_what_try_prints(
    block: Block, machine: Path, cni_tools: CNITools, tmp_path: Path
) -> None:
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    env = {
        **terminal_env(),
        "TMPDIR": str(scratch),
        "CNIDRA_CNI_PATH": cni_tools.plugins,
        netns.TAG_VARIABLE: RUN_TAG,
    }
    shown, printed = run(block, env, prefix=("nsenter", f"--net={machine}"))
    assert printed == shown
    assert not list(scratch.iterdir()), "try left scratch behind"


def test_normalise_keeps_what_does_not_change_per_run() -> None:
    out = normalise(
        "mac: da:29:49:05:db:14 \nhw: DA:29:49:05:db:14\nother: 02:00:00:00:00:01\n"
        f"sandbox: /run/netns/cnidra-try-pod-{RUN_TAG}-82d2b9bb83\n"
        "at: '2026-11-27T00:19:25Z'\naddress: 198.18.10.2/24"
    )
    assert out == (
        "mac: <mac1>\nhw: <mac1>\nother: <mac2>\nsandbox: /run/netns/cnidra-try-pod-<id>\n"
        "at: '<time>'\naddress: 198.18.10.2/24"
    )


def test_parse_splits_a_block_into_commands_and_outputs() -> None:
    steps = parse("$ cnidra a\none\ntwo\n# cnidra b\n$ cnidra c\nthree\n")
    assert steps == (
        Step("cnidra a", "one\ntwo\n"),
        Step("cnidra b", ""),
        Step("cnidra c", "three\n"),
    )
    assert runnable("cnidra validate x.yaml") and runnable("kubectl cnidra --help")
    assert not runnable("kubectl cnidra node pods") and not runnable("cnidra node pods")
    assert not runnable("cnidra validate x.yaml | head") and not runnable("kubectl get pods")


# the command lines the docs show outside console blocks (inline code, sh blocks): each flag
# must be one the (sub)command takes, as its --help lists it
COMMAND_LINE = re.compile(
    r"`((?:kubectl )?cnidra [^`\n]+)`|^(?:[$#] )?((?:kubectl )?cnidra [^\n]+)$", re.M
)
SUBCOMMANDS = {"node": {"pods", "describe", "events", "attach", "detach"}}
_helps: dict[tuple[str, ...], str] = {}


def helped(words: tuple[str, ...]) -> str:
    if words not in _helps:
        ran = subprocess.run(
            [*executable(["cnidra", *words]), "--help"],
            env={**terminal_env(), "COLUMNS": "250"}, capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
        assert ran.returncode == 0, (words, ran.stdout + ran.stderr)
        _helps[words] = ran.stdout
    return _helps[words]


def commands() -> set[str]:
    """cnidra's subcommands, from the Commands panel of its --help."""
    panel = helped(()).split("Commands", 1)[1]
    return set(re.findall(r"^\W+ ([a-z][\w-]*)  ", panel, re.M))


def doc_command_lines() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        for match in COMMAND_LINE.finditer(path.read_text()):
            line = match.group(1) or match.group(2)
            # the cnidra command only: not what a shell pipes it into or runs after it
            line = re.split(r"\s(?:\||&&|;|>|2>|\\$)|<\(", line)[0]
            found.append((str(path.relative_to(ROOT)), line))
    return found


def test_every_flag_the_docs_give_cnidra_is_one_it_takes() -> None:
    wrong = []
    for doc, line in doc_command_lines():
        words = line.split()
        if words[0] == "kubectl":
            continue  # kubectl cnidra passes the command on to cnidra in the driver pod
        words = words[1:]
        if not words or words[0].startswith("-"):
            path: tuple[str, ...] = ()
        else:
            path = (words[0],)
            after = words[1].split("|")[0] if len(words) > 1 else ""
            if after in SUBCOMMANDS.get(words[0], set()):
                path = (words[0], after)
        if path and path[0] not in commands():
            continue  # a word after `cnidra` in prose, not a subcommand
        text = helped(path)
        for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*|-[a-zA-Z])(?![\w-])", line):
            if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text):
                wrong.append(f"{doc}: `{line}`: {flag} is not in `cnidra {' '.join(path)} --help`")
    assert not wrong, "\n".join(wrong)
