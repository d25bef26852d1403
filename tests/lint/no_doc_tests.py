#!/usr/bin/env python3
"""Fails if a doc comment opens a Rust code block: rustdoc would run it as a doc test,
and `make unit` runs `cargo test --tests`, which skips doc tests (see the Makefile)."""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC_LINE = re.compile(r"^\s*//[/!]\s?(.*)$")
# rustdoc treats a block as Rust unless its info string names another language or
# marks it `ignore`.
NOT_RUST = {"text", "sh", "bash", "console", "json", "yaml", "toml", "sql", "http", "ignore"}

found = []
for path in sorted(ROOT.glob("**/*.rs")):
    if any(part in {"target", ".tools", "node_modules"} for part in path.parts):
        continue
    open_fence = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        doc = DOC_LINE.match(line)
        if not doc or not doc.group(1).lstrip().startswith("```"):
            continue
        if open_fence:
            open_fence = False
            continue
        open_fence = True
        info = {word.strip() for word in doc.group(1).lstrip()[3:].split(",") if word.strip()}
        if not info & NOT_RUST:
            found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")

if found:
    print("doc tests found, which `make unit` would not run (add --doc there):")
    print("\n".join(found))
    sys.exit(1)
