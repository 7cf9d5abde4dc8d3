"""The doc test's directives as a page's author writes them: parsed into what the harness does,
placeholders filled the same way for every block of a page, unknown clauses refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.markdown import blocks
from tests.docs.pages import Page

PAGE = """\
<!-- doctest: env IOTGW_HTTP__PORT={port:a}; prepare onnx-model; until ready: \\S+; background -->
```sh
iotgw serve --broker mqtt://broker:1883
```

<!-- doctest: replace localhost:8080 => localhost:{port:a}; replace mqtt://b:1 => {demo_repo} -->
```sh
curl -s localhost:8080/v2 mqtt://b:1
```
"""


def test_clauses_become_what_the_block_runs_with(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text(PAGE)
    serve, curl = blocks(doc)
    assert serve.env == [("IOTGW_HTTP__PORT", "{port:a}")]
    assert serve.prepare == ["onnx-model"]
    assert serve.until == r"ready: \S+" and serve.background
    assert curl.until is None and not curl.background

    folder = tmp_path / "run"
    folder.mkdir()
    page = Page.open(doc, folder, demo_repo=tmp_path / "repo")
    port = serve.environment(page.expand)["IOTGW_HTTP__PORT"]
    assert re.fullmatch(r"\d+", port)
    assert curl.command(page.expand) == (
        f"curl -s localhost:{port}/v2 {tmp_path / 'repo'}\n"  # one port per name on a page
    )
    assert page.expand("{port:b}") != port
    assert (folder / ".venv").is_symlink()
    page.close()


def test_an_unknown_clause_is_refused(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text("<!-- doctest: env lowercase=1 -->\n```sh\ntrue\n```\n")
    with pytest.raises(ValueError, match="unknown doctest clause 'env lowercase=1'"):
        blocks(doc)
