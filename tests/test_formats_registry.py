"""The one registry of output formats (:mod:`ampgraph.formats.registry`): every command's
``--format`` choices are its names, every writer it names exists, and the CLI writes no format
of its own."""

from __future__ import annotations

import ast
import importlib
import inspect
import io
from pathlib import Path

import click
import pytest

from ampgraph.cli import main
from ampgraph.formats import registry
from ampgraph.report.records import Report
from ampgraph.review.diff import ReportDiff

CLI = Path(registry.__file__).resolve().parent.parent / "cli"

#: Each command (its path under ``ampgraph``), the option that chooses its format, and the kind
#: of result it writes.
COMMANDS = {
    ("table",): ("fmt", "table"),
    ("check",): ("fmt", "check"),
    ("verify",): ("fmt", "verify"),
    ("render",): ("formats", "diagram"),
    ("audit",): ("fmt", "audit"),
    ("diff",): ("fmt", "diff"),
    ("baseline", "check"): ("fmt", "baseline-check"),
    ("ranges",): ("fmt", "ranges"),
    ("compiled",): ("view", "compiled"),
    ("fp8",): ("fmt", "fp8"),
    ("fp8-ranges",): ("fmt", "fp8-ranges"),
    ("policy",): ("fmt", "policy"),
}


def _command(path: tuple[str, ...]) -> click.Command:
    command: click.Command = main
    for name in path:
        assert isinstance(command, click.Group)
        found = command.get_command(click.Context(command), name)
        assert found is not None, path
        command = found
    return command


@pytest.mark.parametrize("path", list(COMMANDS), ids=" ".join)
def test_a_commands_format_choices_are_the_registrys_names(path: tuple[str, ...]) -> None:
    option, kind = COMMANDS[path]
    (param,) = [p for p in _command(path).params if p.name == option]
    assert isinstance(param.type, click.Choice)
    assert tuple(param.type.choices) == registry.names(kind)


def test_every_command_with_a_format_is_known_here() -> None:
    """A new command with a --format names its kind above, so the test sees it."""
    seen = set()

    def walk(command: click.Command, path: tuple[str, ...]) -> None:
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, (*path, name))
        elif any("--format" in p.opts for p in command.params if isinstance(p, click.Option)):
            seen.add(path)

    walk(main, ())
    assert seen == {p for p, (option, _) in COMMANDS.items() if option != "view"}


def test_every_writer_the_registry_names_exists() -> None:
    for kind, writers in registry.REGISTRY.items():
        assert writers, kind
        for fmt, writer in writers.items():
            for target in filter(None, (writer.target, writer.warning)):
                module, _, function = target.partition(":")
                found = importlib.import_module(f"ampgraph.formats.{module}")
                assert callable(getattr(found, function, None)), (kind, fmt, target)


#: A format's own tuning, with a default no command passes: the Markdown diff's row limit, the
#: SARIF's file locator.
OWN = {"limit", "uri"}


def _keywords(target: str) -> set[str]:
    module, _, function = target.partition(":")
    found = getattr(importlib.import_module(f"ampgraph.formats.{module}"), function)
    parameters = list(inspect.signature(found).parameters.values())[1:]  # after the result
    return {p.name for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD} - OWN


@pytest.mark.parametrize("kind", list(registry.REGISTRY))
def test_the_writers_of_a_kind_take_the_same_options(kind: str) -> None:
    """A command passes its options whatever the format: each writer of a kind takes them all
    (``check --format markdown`` was given ``pass_`` its writer did not take)."""
    writers = registry.REGISTRY[kind]
    taken = {f: _keywords(w.target) for f, w in writers.items() if w.target != "outputs:nothing"}
    assert len({frozenset(k) for k in taken.values()}) == 1, taken


def test_the_diagrams_are_the_renderers_formats() -> None:
    from ampgraph.render.files import FORMATS

    assert registry.names("diagram") == FORMATS


def test_the_policy_changes_have_the_references_formats() -> None:
    """``policy --since`` writes its changes in the format chosen among the reference's."""
    assert registry.names("policy-changes") == registry.names("policy")
    assert registry.names("ranges-diff") == tuple(
        n for n in registry.names("ranges") if n in registry.names("ranges-diff")
    )
    assert registry.names("verify-setting") == registry.names("verify")


def test_an_unknown_kind_or_format_is_named() -> None:
    with pytest.raises(KeyError, match="no output kind 'tables'"):
        registry.names("tables")
    with pytest.raises(KeyError, match="diff has no format 'sarif': text, markdown, json"):
        registry.text("diff", "sarif", ReportDiff({}, {}))


def test_write_puts_the_text_on_its_stream_and_the_warning_on_stderr(capsys) -> None:
    """An audit's SARIF of a bundled model (no file of model code, a finding without a source
    line) says on stderr that GitHub shows its results nowhere; stdout is the SARIF alone."""
    from ampgraph.review.audit import Finding

    report = Report("opt-125m", {"name": "amp-fp32"}, {}, {}, [], [])
    finding = Finding("mixed-dtypes", "warning", "add", "aten.add.Tensor", "m", "widened", "cast")
    out = io.StringIO()
    registry.write("audit", "sarif", [report], out, findings=[[finding]], ranges=False)
    assert out.getvalue().startswith("{") and out.getvalue().endswith("}\n")
    assert capsys.readouterr().err.startswith("warning: opt-125m: some results have no source")
    registry.write("audit", "sarif", [report], out, findings=[[]], ranges=False)
    assert capsys.readouterr().err == ""


#: Calls that write output or make a format's text themselves: printing, JSON, files, Graphviz.
WRITING = {"json.dumps", "json.dump", "dumps", "sys.stdout.write", "atomic_write",
           "run_dot", "lay_out"}  # fmt: skip
#: Methods that write a file whatever they are called on.
WRITING_METHODS = {"write_text", "write_bytes"}
#: Names under which a command holds its output format.
FORMAT_NAMES = {"fmt", "format", "params['fmt']", "params.get('fmt')"}


def _writes(call: ast.Call, function: str) -> bool:
    name = ast.unparse(call.func)
    if name in WRITING or name.rpartition(".")[2] in WRITING_METHODS:
        return True
    # Standard output is the result's: only write_output prints it. Standard error takes
    # errors and notes.
    if name == "click.echo":
        to_stderr = any(k.arg == "err" and isinstance(k.value, ast.Constant) and k.value.value
                        for k in call.keywords)  # fmt: skip
        return not to_stderr and function != "write_output"
    if name == "print":
        return not any(k.arg == "file" and ast.unparse(k.value) == "sys.stderr"
                       for k in call.keywords)  # fmt: skip
    return False


def _chooses_a_format(node: ast.Compare, parents: dict[ast.AST, ast.AST]) -> bool:
    """A comparison of the output format with a name, other than a usage error's test (``if fmt
    == "markdown": raise UsageError(...)``): choosing what to write by format is the registry's."""
    sides = [node.left, *node.comparators]
    if not any(ast.unparse(side) in FORMAT_NAMES for side in sides):
        return False
    child, parent = node, parents.get(node)
    while parent is not None and not (isinstance(parent, ast.If) and child is parent.test):
        child, parent = parent, parents.get(parent)
    refused = isinstance(parent, ast.If) and [type(s) for s in parent.body] == [ast.Raise]
    return not refused


def formatting_outside_the_registry(source: str) -> list[str]:
    """Each place in ``source`` (a module of ampgraph.cli) that writes output or picks a format
    itself rather than through :mod:`ampgraph.formats.registry`: printing (``click.echo`` to
    standard output outside ``write_output``, ``print``), JSON, written files, Graphviz layouts,
    and branches on the format other than usage errors."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def function_of(node: ast.AST) -> str:
        while node in parents:
            node = parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node.name
        return ""

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _writes(node, function_of(node)):
            found.append(f"{node.lineno}: {ast.unparse(node.func)}")
        elif isinstance(node, ast.Compare) and _chooses_a_format(node, parents):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_command_line_writes_no_output_of_its_own() -> None:
    """Output goes through the formats: no module of ampgraph.cli prints a result but through
    ``console.write_output``, makes JSON, writes a file or lays out a diagram, or branches on
    the format but to refuse a combination of options."""
    found = {
        path.name: formatting_outside_the_registry(path.read_text())
        for path in sorted(CLI.glob("*.py"))
    }
    assert {name: places for name, places in found.items() if places} == {}


@pytest.mark.parametrize(
    "source",
    [
        "import json\ndef f(r):\n    click.echo(json.dumps(r))\n",
        "def f(p):\n    click.echo(f'{p}: written')\n",
        "def f(r):\n    print(r)\n",
        "def f(p, text):\n    p.write_text(text)\n",
        "def f(p, source):\n    atomic_write(p, source.encode())\n",
        "def f(fmt, s):\n    if fmt == 'dot':\n        return s\n    return run(s)\n",
        "def f(fmt, s):\n    return s if fmt != 'text' else ''\n",
        "def f(params):\n    if params['fmt'] in ('json', 'sarif'):\n        g()\n",
    ],
)
def test_formatting_in_the_command_line_is_caught(source: str) -> None:
    assert formatting_outside_the_registry(source) != []


def test_errors_usage_refusals_and_write_output_are_not_formatting() -> None:
    source = (
        "def write_output(kind, fmt, result):\n    click.echo(registry.text(kind, fmt, result))\n"
        "def f(fmt, classes):\n    click.echo('note: traced on the CPU', err=True)\n"
        "    print('Error: no such file', file=sys.stderr)\n"
        "    if classes and fmt == 'json':\n        raise click.UsageError('--only is text')\n"
        "    write_output('table', fmt, classes)\n"
    )
    assert formatting_outside_the_registry(source) == []


def test_the_formats_import_no_torch() -> None:
    """Every format module (the registry imports them when a command writes) is torch-free: it
    lays out records, and a warm run that writes from the cache never loads torch."""
    import subprocess
    import sys

    modules = sorted(p.stem for p in CLI.parent.joinpath("formats").glob("*.py"))
    code = (f"import sys\nfor m in {modules!r}: __import__('ampgraph.formats.' + m)\n"
            "print('torch' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
