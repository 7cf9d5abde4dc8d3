"""The fenced blocks of the project's Markdown, and what the doc tests do with each.

A block's language names what it is: ``sh`` blocks are commands and run against a live gateway;
anything else (``text`` for output and diagrams, ``toml``, ``json``, ``python``) is read, not run.
An HTML comment on the line before a fence steers the doc test, clauses separated by ``;``:

- ``<!-- doctest: skip (needs docker) -->``: not run, counted as skipped with its reason;
- ``replace OLD => NEW``: run with OLD replaced (shorter durations, the test's broker);
- ``expect REGEX``: what the block prints must contain a match (one clause per check);
- ``file NAME``: a non-shell block written to NAME in the folder the file's commands run in;
- ``timeout SECONDS``: the block's limit (default ``DEFAULT_TIMEOUT_S``);
- ``env NAME=VALUE``: run with NAME set in the environment (a gateway's port, say);
- ``prepare NAME``: before the block, ``python -m tests.docs.inputs NAME`` writes input files
  (a checkpoint, a model) in the page's folder, made from code;
- ``until REGEX``: a block that does not end by itself (a server) passes once its output
  (stdout and stderr together) matches, and is then stopped;
- ``background``: with ``until``, left running for the page's later blocks, stopped after the
  page's last one.

In the NEW of ``replace`` and the VALUE of ``env``, ``{port:NAME}`` is a free port (the same for
one NAME on a page), ``{broker}`` the URL of a real Mosquitto started for the page, and
``{demo_repo}`` the demo model repository the test's own gateway serves.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL = frozenset({"sh", "bash", "shell"})
DEFAULT_TIMEOUT_S = 120.0
_FENCE = re.compile(r"^(`{3,})(\S*)\s*$")
_DIRECTIVE = re.compile(r"^<!--\s*doctest:\s*(.*?)\s*-->\s*$")
_SKIP = re.compile(r"^skip \((.+)\)$")


def documents() -> list[Path]:
    """README.md and every page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]


@dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    skip: str | None = None  # the reason, when skipped
    replace: list[tuple[str, str]] = field(default_factory=list)
    expect: list[str] = field(default_factory=list)
    file: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    env: list[tuple[str, str]] = field(default_factory=list)
    prepare: list[str] = field(default_factory=list)
    until: str | None = None
    background: bool = False

    @property
    def where(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.lang in SHELL and self.skip is None

    def command(self, expand: Callable[[str], str] = str) -> str:
        """The block's text with its replacements, their placeholders filled by ``expand``."""
        text = self.text
        for old, new in self.replace:
            if old not in text:
                raise ValueError(f"{self.where}: 'replace {old}' matches nothing in the block")
            text = text.replace(old, expand(new))
        return text

    def environment(self, expand: Callable[[str], str] = str) -> dict[str, str]:
        return {name: expand(value) for name, value in self.env}


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path`` with the directive just above it applied."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, lang = opening.groups()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), len(lines))
        block = Block(path, i + 1, lang, "\n".join(lines[i + 1 : end]) + "\n")
        directive = _DIRECTIVE.match(lines[i - 1]) if i > 0 else None
        if directive is not None:
            _apply(block, directive.group(1))
        out.append(block)
        i = end + 1
    return out


def _apply(block: Block, directive: str) -> None:
    # Clauses split at ';' outside parentheses: a skip's reason may hold one.
    for clause in (c.strip() for c in re.split(r";(?![^()]*\))", directive)):
        word, _, rest = clause.partition(" ")
        if (skip := _SKIP.match(clause)) is not None:
            block.skip = skip.group(1)
        elif word == "replace" and " => " in rest:
            old, new = rest.split(" => ", 1)
            block.replace.append((old, new))
        elif word == "expect" and rest:
            block.expect.append(rest)
        elif word == "file" and rest:
            block.file = rest
        elif word == "timeout" and rest:
            block.timeout_s = float(rest)
        elif word == "env" and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", rest):
            name, _, value = rest.partition("=")
            block.env.append((name, value))
        elif word == "prepare" and rest:
            block.prepare.append(rest)
        elif word == "until" and rest:
            block.until = rest
        elif clause == "background":
            block.background = True
        else:
            raise ValueError(f"{block.where}: unknown doctest clause {clause!r}")
