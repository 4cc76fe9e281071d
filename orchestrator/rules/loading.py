"""Reading rule files from disk: the rule engine's only file I/O.

Called by `tuneloop check`/`simulate`/`test`, by the service at start and by
`handlers/rules_reloading.py` on every change. A path may be a file or a directory (its
`*.yaml` and `*.yml` files, sorted, not recursive).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from orchestrator.rules.model import RuleSet
from orchestrator.rules.parsing import Problem, RuleFileError, Source, parse_files


def rule_files(paths: Iterable[str | Path]) -> tuple[Path, ...]:
    """The files *paths* name, directories expanded, in a stable order.

    Raises:
        RuleFileError: a path does not exist or a directory holds no rule file.
    """
    files: list[Path] = []
    problems: list[Problem] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted([*path.glob("*.yaml"), *path.glob("*.yml")])
            if not found:
                problems.append(Problem(str(path), 1, 1, "directory holds no *.yaml rule file"))
            files += found
        elif path.is_file():
            files.append(path)
        else:
            problems.append(Problem(str(path), 1, 1, "no such file or directory"))
    if problems:
        raise RuleFileError(problems)
    return tuple(dict.fromkeys(files))


def read_sources(paths: Iterable[str | Path]) -> tuple[Source, ...]:
    """The text of every rule file *paths* name."""
    sources = []
    for path in rule_files(paths):
        try:
            sources.append(Source(str(path), path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            raise RuleFileError([Problem(str(path), 1, 1, f"cannot read: {exc}")]) from exc
    return tuple(sources)


def load_rules(paths: Iterable[str | Path]) -> RuleSet:
    """Load and validate the rule files under *paths*.

    Raises:
        RuleFileError: (a ConfigError) listing every problem as FILE:LINE:COL: message.
    """
    return parse_files(read_sources(paths))


def content_hash(paths: Iterable[str | Path]) -> str:
    """A hash of the names and bytes of the rule files: changes when any of them does.

    Missing files hash as absent rather than failing, so a watcher can notice a file that
    comes back.
    """
    digest = hashlib.sha256()
    for raw in paths:
        path = Path(raw)
        files = sorted([*path.glob("*.yaml"), *path.glob("*.yml")]) if path.is_dir() else [path]
        for file in files:
            digest.update(str(file).encode() + b"\0")
            try:
                digest.update(file.read_bytes())
            except OSError:
                digest.update(b"<absent>")
            digest.update(b"\0")
    return digest.hexdigest()
