#!/usr/bin/env python3
"""Fails when, inside one crate, a top-level module imports (`crate::x`) a module that imports it
back, directly or through others: each concern has one home below the ones that use it
(docs/design.md, "One home for each concern"). Test code (`#[cfg(test)]` and `tests` modules)
and comments are left out. Prints each loop with the lines that make it."""

import os
import re
import sys


def top_module(src, path):
    parts = os.path.relpath(path, src)[: -len(".rs")].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return parts[0] if parts else None


def edges(src):
    graph = {}
    for root, _, files in os.walk(src):
        for name in files:
            path = os.path.join(root, name)
            if not name.endswith(".rs") or name == "tests.rs" or f"{os.sep}tests{os.sep}" in path:
                continue
            module = top_module(src, path)
            text = open(path, encoding="utf-8").read().split("#[cfg(test)]")[0]
            for number, line in enumerate(text.splitlines(), 1):
                if line.lstrip().startswith("//"):
                    continue
                for used in re.findall(r"\bcrate::([a-z_0-9]+)", line):
                    if module and used != module:
                        graph.setdefault(module, {}).setdefault(used, f"{path}:{number}")
    return graph


def loops(graph):
    state, stack, found = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in graph.get(node, {}):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "crates"
    bad = 0
    for crate in sorted(os.listdir(root)):
        src = os.path.join(root, crate, "src")
        if not os.path.isdir(src):
            continue
        graph = edges(src)
        for cycle in loops(graph):
            bad += 1
            print(f"{crate}: module loop {' -> '.join(cycle)}")
            for a, b in zip(cycle, cycle[1:]):
                print(f"  {a} -> {b} at {graph[a][b]}")
    if bad:
        print("move what both sides need into a module of its own (docs/design.md)")
        return 1
    print("module-loops: no loop between the top-level modules of any crate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
