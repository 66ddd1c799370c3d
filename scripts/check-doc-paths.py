#!/usr/bin/env python3
"""Every repository path the docs name exists.

Scans README.md and docs/*.md for paths written in backticks (inline code and fenced
code blocks) or as markdown link targets, and prints each one that does not exist in
the repository as FILE:LINE: PATH. Exits 1 if there is any, 0 otherwise.

What counts as a repository path: a token that starts with one of the repository's
top-level entries (`fabric/`, `docs/`, `scripts/`, ..., `README.md`, `Cargo.toml`)
and either contains a '/' or is one of those files. Markdown link targets are
resolved against the folder of the file that holds them (as a renderer does). A
`:line` or `:line-line` suffix, a `::item` suffix and a `#anchor` are stripped.
Skipped: URLs, absolute paths and `~/…` paths (not in the repository), and globs or
placeholders (anything with `*`, `{`, `<`, `…`, `...` or a shell variable's `$`).

Usage: python3 scripts/check-doc-paths.py [FILE.md ...]   (default: README.md docs/*.md)
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TOP_DIRS = (
    "backend/", "fabric/", "client/", "gateway/", "engine/", "testkit/", "node/", "bench/", "coordinator/", "workers/", "messages/",
    "config/", "procs/", "store/",
    "src/", "tests/", "docs/", "scripts/", "deploy/", "dashboards/", "examples/", ".ci/",
)
TOP_FILES = ("README.md", "Cargo.toml")
PLACEHOLDER = ("*", "{", "<", "…", "...", "$")

INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# Characters that end a path inside a command line or a sentence.
SPLIT = re.compile(r"[\s,;()\[\]\"'=|]+")
LINE_SUFFIX = re.compile(r":\d+(?:-\d+)?$")


def clean(token):
    """The path a token names, or None when it names none we check."""
    token = token.strip().rstrip(".,:;!?")
    if not token or any(p in token for p in PLACEHOLDER):
        return None
    token = token.split("#", 1)[0]
    token = token.split("::", 1)[0]
    token = LINE_SUFFIX.sub("", token)
    token = token.rstrip(".,:;!?")
    if token.startswith("./"):
        token = token[2:]
    if token in TOP_FILES or token.startswith(TOP_DIRS):
        return token
    return None


def code_paths(text):
    """Repository paths among the words of a piece of code."""
    for word in SPLIT.split(text):
        path = clean(word)
        if path:
            yield path


def link_path(target, doc_dir):
    """The repository path a markdown link target names, or None."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("#", "/", "~")):
        return None  # a URL, an anchor in the same page, an absolute path
    target = target.split("#", 1)[0]
    if not target or any(p in target for p in PLACEHOLDER):
        return None
    resolved = os.path.normpath(os.path.join(doc_dir, target))
    if resolved.startswith(".."):
        return target  # outside the repository: report as written
    return resolved


def check(doc):
    """(doc, line, path) for each path `doc` names that does not exist."""
    rel_doc = os.path.relpath(doc, ROOT)
    doc_dir = os.path.dirname(rel_doc)
    found = []  # (line, path)
    with open(doc, encoding="utf-8") as f:
        lines = f.read().split("\n")

    def prose(block_start, block):
        # Inline code may wrap across lines within a paragraph, so a paragraph is
        # searched as one text and each hit mapped back to its line.
        text = "\n".join(block)
        for match in INLINE_CODE.finditer(text):
            line = block_start + text.count("\n", 0, match.start())
            found.extend((line, path) for path in code_paths(match.group(2)))
        rest = INLINE_CODE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        for match in LINK.finditer(rest):
            path = link_path(match.group(1), doc_dir)
            if path:
                found.append((block_start + rest.count("\n", 0, match.start()), path))

    in_fence = False
    block, block_start = [], 1
    for lineno, line in enumerate(lines, 1):
        stripped = line.lstrip()
        if stripped.startswith("```") or stripped.startswith("~~~"):
            prose(block_start, block)
            block, block_start = [], lineno + 1
            in_fence = not in_fence
            continue
        if in_fence:
            found.extend((lineno, path) for path in code_paths(line))
        elif not stripped or stripped.startswith(("|", "#")):
            # Blank lines end a paragraph; table rows and headings stand alone.
            prose(block_start, block)
            if stripped:
                prose(lineno, [line])
            block, block_start = [], lineno + 1
        else:
            block.append(line)
    prose(block_start, block)
    return [
        (rel_doc, line, path)
        for line, path in sorted(found)
        if not os.path.exists(os.path.join(ROOT, path))
    ]


def main(argv):
    if argv:
        docs = [os.path.abspath(a) for a in argv]
    else:
        docs = [os.path.join(ROOT, "README.md")]
        docs_dir = os.path.join(ROOT, "docs")
        docs += sorted(
            os.path.join(docs_dir, name) for name in os.listdir(docs_dir) if name.endswith(".md")
        )
    missing = []
    for doc in docs:
        missing.extend(check(doc))
    for rel_doc, lineno, path in missing:
        print(f"{rel_doc}:{lineno}: {path} does not exist")
    if missing:
        print(f"{len(missing)} path(s) named in the docs do not exist", file=sys.stderr)
        return 1
    print(f"doc paths: {len(docs)} files checked, every named path exists")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
