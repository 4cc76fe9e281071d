"""Reference pages generated from the code itself: settings and CLI.

- docs/reference/settings.md: each settings field documents its unit, default and reason in an
  attribute docstring (kopf's habit); `settings_page(cli)` reads those docstrings from
  `orchestrator/settings.py` with `ast` and renders one table per group, naming the option
  of `tuneloop run` that overrides a variable.
- docs/reference/cli.md: `cli_page(cli)` renders every command's usage, arguments and options
  from the typer app.

Both take the typer app from their caller (`handlers/cli/reference_commands.py`), so this
module imports neither the CLI (which imports it: a cycle) nor the runtimes.

`tests/unit/test_reference_pages.py` fails when a committed page differs from what the code
renders. Regenerate with `tuneloop reference settings > docs/reference/settings.md` (and `cli`).
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import typer
import typer.main

from orchestrator import settings as core_settings


@dataclass(frozen=True, slots=True)
class Field:
    """One documented field of a settings class."""

    name: str
    default: str
    doc: str


def fields_of(module: ModuleType, class_name: str) -> dict[str, Field]:
    """The fields of *class_name* in *module*, with their defaults and attribute docstrings."""
    tree = _parse(Path(inspect.getfile(module)).read_text(encoding="utf-8"))
    found: dict[str, Field] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and node.name == class_name):
            continue
        body = node.body
        for index, item in enumerate(body):
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            nxt = body[index + 1] if index + 1 < len(body) else None
            doc = ""
            if (
                isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                doc = " ".join(nxt.value.value.split())
            default = _default_text(item.value)
            found[item.target.id] = Field(item.target.id, default, doc)
    return found


def _parse(source: str) -> ast.Module:
    try:
        return ast.parse(source)
    except SystemError:
        # CPython 3.11.7 keeps the AST converter's recursion depth in state that all threads
        # share (python/cpython#106905, fixed in later releases): a finalizer that parses on
        # another thread mid-conversion leaves it off, and this parse refuses ("AST constructor
        # recursion depth mismatch"). The source is fine, and the next parse starts afresh.
        return ast.parse(source)


def _default_text(value: ast.expr | None) -> str:
    if value is None:
        return "(required)"
    if isinstance(value, ast.Call) and ast.unparse(value.func) == "field":
        for keyword in value.keywords:
            if keyword.arg == "default":
                return ast.unparse(keyword.value)
            if keyword.arg == "default_factory" and isinstance(keyword.value, ast.Lambda):
                return _made(keyword.value.body)
    return ast.unparse(value)


def _made(body: ast.expr) -> str:
    """What a `default_factory` lambda makes: its body, unwrapped from a read-only view."""
    if isinstance(body, ast.Call) and ast.unparse(body.func) == "MappingProxyType" and body.args:
        return ast.unparse(body.args[0])
    return ast.unparse(body)


def _row(variable: str, field: Field) -> str:
    doc = field.doc.replace("|", "\\|")
    default = field.default.replace("|", "\\|")
    return f"| `{variable}` | `{default}` | {doc} |"


def _group(class_name: str, prefix: str) -> list[str]:
    return [
        _row(f"{prefix}{name.upper()}", field)
        for name, field in fields_of(core_settings, class_name).items()
    ]


def _kafka() -> list[str]:
    return [
        "## Kafka (`TUNELOOP_KAFKA_*`)",
        "",
        "Lists (`TOPICS_IN`) are comma-separated; durations are seconds.",
        "",
        "| variable | default | meaning |",
        "| --- | --- | --- |",
        *_group("KafkaSettings", f"{core_settings.ENV_PREFIX}KAFKA_"),
    ]


def _kubernetes() -> list[str]:
    return [
        "## Kubernetes backend (`TUNELOOP_KUBERNETES_*`)",
        "",
        "| variable | default | meaning |",
        "| --- | --- | --- |",
        *_group("KubernetesSettings", f"{core_settings.ENV_PREFIX}KUBERNETES_"),
    ]


def _handoff() -> list[str]:
    return [
        "## The hand-off (`tuneloop handoff`, `TUNELOOP_HANDOFF_*`)",
        "",
        "`TARGETS` and `PATHS` are JSON objects; durations are seconds"
        " ([inference.md](../inference.md)).",
        "",
        "| variable | default | meaning |",
        "| --- | --- | --- |",
        *_group("HandoffSettings", f"{core_settings.ENV_PREFIX}HANDOFF_"),
    ]


def _mlflow() -> list[str]:
    return [
        "## MLflow tracking and the champion (`TUNELOOP_MLFLOW_*`)",
        "",
        "Off unless `TRACKING_URI` is set; credentials are MLflow's own `MLFLOW_TRACKING_TOKEN`"
        " or `MLFLOW_TRACKING_USERNAME`/`MLFLOW_TRACKING_PASSWORD`"
        " ([tracking.md](../tracking.md)).",
        "",
        "| variable | default | meaning |",
        "| --- | --- | --- |",
        *_group("MlflowSettings", f"{core_settings.ENV_PREFIX}MLFLOW_"),
    ]


def _worker(cli: typer.Typer) -> list[str]:
    run = typer.main.get_command(cli).commands["run"]  # type: ignore[attr-defined]
    options = {param.name: param.opts[0] for param in run.params}
    rows = []
    for name, field in fields_of(core_settings, "WorkerSettings").items():
        doc = field.doc.replace("|", "\\|")
        default = field.default.replace("|", "\\|")
        option = f"`{options[name]}`" if name in options else ""
        variable = f"{core_settings.ENV_PREFIX}{name.upper()}"
        rows.append(f"| `{variable}` | {option} | `{default}` | {doc} |")
    return [
        "## The worker (`tuneloop run`)",
        "",
        "An option given to `tuneloop run` wins over its variable.",
        "",
        "| variable | option | default | meaning |",
        "| --- | --- | --- | --- |",
        *rows,
    ]


def settings_page(cli: typer.Typer) -> str:
    """The whole settings reference page; *cli* is the `tuneloop` app (for `run`'s options)."""
    lines = [
        "# Settings reference",
        "",
        "Generated from the settings' docstrings by `tuneloop reference settings`; do not edit.",
        "Every variable is optional unless marked required; unset ones keep their default.",
        "",
        *_worker(cli),
        "",
        *_kafka(),
        "",
        *_kubernetes(),
        "",
        *_handoff(),
        "",
        *_mlflow(),
    ]
    return "\n".join(lines) + "\n"


def cli_page(cli: typer.Typer) -> str:
    """Every command of *cli* (the `tuneloop` app) with its arguments and options."""
    lines = [
        "# CLI reference",
        "",
        "Generated from the commands by `tuneloop reference cli`; do not edit by hand.",
        "",
    ]

    # typer vendors its own click, so commands are inspected by shape, not by class.
    def walk(command: Any, path: str) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands is not None:
            for name in sorted(subcommands):
                walk(subcommands[name], f"{path} {name}")
            return
        summary = " ".join((command.help or "").split())
        lines.extend([f"## `{path}`", "", summary, ""])
        rows = []
        for param in command.params:
            if param.param_type_name == "argument":
                rows.append(f"| `{(param.name or '').upper()}` | (argument) | |")
                continue
            if param.param_type_name != "option" or param.name == "help":
                continue
            default = "" if param.required or param.default is None else repr(param.default)
            meaning = " ".join((param.help or "").split()).replace("|", "\\|")
            env = f" (`{param.envvar}`)" if param.envvar else ""
            rows.append(f"| `{'`, `'.join(param.opts)}`{env} | `{default}` | {meaning} |")
        if rows:
            lines.extend(["| option | default | meaning |", "| --- | --- | --- |", *rows, ""])

    walk(typer.main.get_command(cli), "tuneloop")
    return "\n".join(lines).rstrip() + "\n"
