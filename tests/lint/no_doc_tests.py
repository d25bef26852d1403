#!/usr/bin/env python3
"""Fails if a doc comment holds a Rust code block: rustdoc would run it as a doc test,
and `make unit` runs `cargo test --tests`, which skips doc tests (see the Makefile).

A block is Rust unless its info string names something rustdoc does not know (`text`,
`sh`, ...) or `ignore`: rustdoc's own attributes (`rust`, `no_run`, `should_panic`, ...)
keep it a test. Fenced blocks (``` and ~~~), indented blocks after a blank doc line,
and docs pulled in with `#[doc = include_str!(...)]` are all found."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
LINE_DOC = re.compile(r"^\s*//[/!](?!/)\s?(.*)$")
FENCE = re.compile(r"^\s{0,3}(```|~~~)(.*)$")
RUSTDOC_ATTRIBUTES = {"rust", "no_run", "should_panic", "compile_fail", "test_harness",
                      "standalone_crate"}


def runs_as_test(info: str) -> bool:
    words = [word for word in re.split(r"[,\s]+", info.strip()) if word]
    if "ignore" in words:
        return False
    return all(word in RUSTDOC_ATTRIBUTES or word.startswith("edition") for word in words)


def doc_blocks(text: str):
    """Each run of doc comment lines, as (first line number, the lines' text)."""
    block, start = [], 0
    in_block_comment = False
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if in_block_comment:
            end = stripped.endswith("*/")
            block.append(re.sub(r"^\s*\*?\s?", "", stripped[:-2] if end else line))
            if end:
                in_block_comment = False
                yield start, block
                block = []
            continue
        if stripped.startswith(("/**", "/*!")) and not stripped.startswith("/***"):
            if block:
                yield start, block
            start, block = number, [stripped[3:].removesuffix("*/")]
            in_block_comment = not stripped.endswith("*/") or len(stripped) < 5
            if not in_block_comment:
                yield start, block
                block = []
            continue
        doc = LINE_DOC.match(line)
        if doc:
            if not block:
                start = number
            block.append(doc.group(1))
        elif block:
            yield start, block
            block = []
    if block:
        yield start, block


def rust_blocks(lines):
    """Offsets of the lines that open a block rustdoc runs as Rust."""
    fence = None
    previous_blank = True
    for offset, line in enumerate(lines):
        opened = FENCE.match(line)
        if fence:
            if opened and opened.group(1) == fence and not opened.group(2).strip():
                fence = None
        elif opened:
            fence = opened.group(1)
            if runs_as_test(opened.group(2)):
                yield offset
        elif previous_blank and line.startswith("    ") and line.strip():
            yield offset
        previous_blank = not line.strip()


def tracked_sources():
    listed = subprocess.run(["git", "ls-files", "*.rs"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    return [ROOT / name for name in listed.splitlines()]


found = []
for path in tracked_sources():
    text = path.read_text(encoding="utf-8")
    name = path.relative_to(ROOT)
    for number, line in enumerate(text.splitlines(), 1):
        if re.search(r"#!?\[doc\s*=\s*include_str!", line):
            found.append(f"{name}:{number}: docs from a file: {line.strip()}")
    for start, lines in doc_blocks(text):
        for offset in rust_blocks(lines):
            found.append(f"{name}:{start + offset}: {lines[offset].strip()}")

if found:
    print("doc tests found, which `make unit` does not run (add --doc there):")
    print("\n".join(found))
    sys.exit(1)
