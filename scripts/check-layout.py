#!/usr/bin/env python3
"""Checks the house rules the layout promises (docs/architecture.md):

- no import loops between files: a file that refers to another (``use crate::a::b``,
  ``crate::a::b::c`` in code, ``super::x``) must not be referred back to, directly or
  through others, within one crate;
- no file over 600 lines, except the SIMD kernels and tests.

Run from the repository root; exits non-zero and names what is wrong.
"""
import os
import re
import sys

MAX_LINES = 600
# Kernels are long by nature (one function per quant type and ISA); tests are lists.
EXEMPT = re.compile(r"(/kernels/|/tests?\.rs$|/tests/)")
PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP = re.compile(r"\buse\s+(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*)\};", re.S)
COMMENT = re.compile(r"//[^\n]*")


def crates(root):
    for entry in sorted(os.listdir(root)):
        src = os.path.join(root, entry, "src")
        if os.path.isfile(os.path.join(root, entry, "Cargo.toml")) and os.path.isdir(src):
            yield entry, src
    if os.path.isdir(os.path.join(root, "src")):
        yield ".", os.path.join(root, "src")


def module_of(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    failures = []
    for name, src in crates(root):
        files = {}
        for d, _, fs in os.walk(src):
            for f in fs:
                if f.endswith(".rs"):
                    p = os.path.join(d, f)
                    files[module_of(src, p)] = p
        edges = {m: set() for m in files}
        for mod, path in files.items():
            text = open(path, encoding="utf-8").read()
            lines = text.count("\n")
            rel = os.path.relpath(path, root)
            if lines > MAX_LINES and not EXEMPT.search("/" + rel):
                failures.append(f"{rel}: {lines} lines (more than {MAX_LINES})")
            code = COMMENT.sub("", text)
            # The test module of a file is part of that file.
            code = code.split("#[cfg(test)]")[0]
            refs = []
            for m in USE_GROUP.finditer(code):
                for item in re.split(r"[,\s]+", m.group(3)):
                    item = item.strip("{} ")
                    if item and item not in ("self", "*"):
                        refs.append((m.group(1), m.group(2) + "::" + item.split("::")[0]))
            refs += [(m.group(1), m.group(2)) for m in PATH.finditer(code)]
            for base, tail in refs:
                parts = [p for p in tail.split("::") if p]
                if base == "crate":
                    target = parts
                elif base == "super":
                    # `super` of a/b/c.rs and of a/b/c/mod.rs is a/b.
                    here = list(mod[:-1])
                    while parts and parts[0] == "super":
                        here = here[:-1]
                        parts = parts[1:]
                    target = here + parts
                else:
                    target = list(mod) + parts
                # The longest prefix that is a file.
                for n in range(len(target), -1, -1):
                    t = tuple(target[:n])
                    if t in files:
                        if t != mod:
                            edges[mod].add(t)
                        break
        # Cycles: strongly connected components of more than one file.
        index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

        def strong(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in edges[v]:
                if w not in index:
                    strong(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    sccs.append(comp)

        sys.setrecursionlimit(10000)
        for v in sorted(edges):
            if v not in index:
                strong(v)
        for comp in sccs:
            names = sorted(os.path.relpath(files[m], root) for m in comp)
            failures.append(f"import loop in {name}: " + " <-> ".join(names))
    for f in failures:
        print(f)
    if failures:
        sys.exit(1)
    print("layout: no import loops, no oversized files")


main()
