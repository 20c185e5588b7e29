#!/usr/bin/env python3
"""Fails when, inside one crate, modules import each other in a circle: each concern has one
home below the ones that use it (docs/design.md, "One home for each concern").

Every file is a module (`a/b.rs` and `a/b/mod.rs` are `crate::a::b`). A module depends on the
module that defines what it names: `use` declarations (brace groups expanded, `self`, `super`,
`crate` and child-module paths resolved) and paths written in code (`crate::x::f`,
`super::y::T`). A name reached through a re-export or any other `use` of another module
(`super::Thing` where the parent says `pub use child::Thing`) is followed to the module that
defines it, so a loop through a parent's re-exports is seen.

A module and its own descendants are one unit: a folder module declares its children and often
re-exports them, and children use their parent's items; that is not a loop. Everything else is
checked at each level of the tree: for every module (the crate root included), the subtrees of
its children must not import each other in a circle. For files that is the circle between two
sibling files (`backfill/pages.rs` <-> `backfill/publish.rs`); one level up it is the circle
between two folders, whichever of their files make it.

Test code (`#[cfg(test)]` items, modules declared under `#[cfg(test)]`, `tests.rs` and `tests/`
folders), comments and string literals are left out. Each loop is printed with the files and
lines that make it. An argument names the folder of crates (default `crates`).

Written here rather than taken from cargo-modules (`dependencies --acyclic`): that one builds
rust-analyzer (minutes on CI's two cores, on every fresh machine) and counts a child's `super::`
use of its parent as a cycle, which every folder module with re-exports has."""

import bisect
import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


# ---- source text -------------------------------------------------------------------------------


def blank_keeping_lines(chunk):
    return re.sub(r"[^\n]", " ", chunk)


# Comments, then string literals (raw, byte, plain), then char literals (a lifetime is none).
# Block comments are taken as not nested: none in this tree is.
LITERAL_RE = re.compile(
    r"//[^\n]*|/\*.*?\*/"
    r'|(?<!\w)b?r(#*)".*?"\1|b?"(?:\\.|[^"\\])*"'
    r"|'(?:\\.[^']*|[^\\'\n])'",
    re.S,
)


def strip_comments_and_strings(text):
    """Blanks comments and the contents of string and char literals, keeping line breaks so that
    line numbers stay right."""
    return LITERAL_RE.sub(lambda m: blank_keeping_lines(m.group(0)), text)


def matching_brace(text, start):
    """Index just past the brace that closes the one at `start`."""
    depth = 0
    for j in range(start, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


def remove_test_items(text):
    """Blanks each item under `#[cfg(test)]` (a `mod x;`, a `use`, or a braced item); returns the
    text and the names of the modules declared under it."""
    test_modules = []
    for m in reversed(list(re.finditer(r"#\[cfg\(test\)\]", text))):
        start = m.start()
        rest = text[m.end() :]
        decl = re.match(r"(\s*#\[[^\]]*\])*\s*(pub(\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", rest)
        if decl:
            test_modules.append(decl.group(4))
            end = m.end() + decl.end()
        else:
            semi, brace = rest.find(";"), rest.find("{")
            if brace < 0 or (0 <= semi < brace):
                end = m.end() + (semi + 1 if semi >= 0 else len(rest))
            else:
                end = matching_brace(text, m.end() + brace)
        text = text[:start] + blank_keeping_lines(text[start:end]) + text[end:]
    return text, test_modules


# ---- `use` trees -------------------------------------------------------------------------------


def parse_use_tree(src):
    """`a::{b, c::{self, D as E}, f::*}` -> [(["a", "b"], "b"), (["a", "c"], "c"), (["a", "c",
    "D"], "E"), (["a", "f", "*"], None)]: each path with the name it binds."""
    tokens = re.findall(IDENT + r"|::|\{|\}|,|\*", src)
    pos = 0

    def tree(prefix):
        nonlocal pos
        found, path = [], list(prefix)
        while pos < len(tokens):
            tok = tokens[pos]
            if tok == "{":
                pos += 1
                while pos < len(tokens) and tokens[pos] != "}":
                    found += tree(path)
                    if pos < len(tokens) and tokens[pos] == ",":
                        pos += 1
                pos += 1
                return found
            if tok == "*":
                pos += 1
                return found + [(path + ["*"], None)]
            if tok == "::":
                pos += 1
                continue
            if tok in (",", "}"):
                break
            pos += 1
            if tok == "self" and path:
                continue
            if tok == "as":
                alias = tokens[pos]
                pos += 1
                return found + [(path, alias if alias != "_" else None)]
            path.append(tok)
        return found + ([(path, path[-1])] if path else [])

    return tree([])


USE_RE = re.compile(r"(?:^|[;{}\]\s])((?:pub(?:\s*\([^)]*\))?\s+)?use\s+)([^;]*);", re.S)


# ---- the crate's modules -----------------------------------------------------------------------


class Module:
    def __init__(self, path, file):
        self.path = path  # tuple of names below the crate root
        self.file = file
        self.uses = {}  # name bound here -> (absolute path, line)
        self.refs = []  # (absolute path, line) named in this module
        self.text = ""


def module_path(src, file):
    parts = os.path.relpath(file, src)[: -len(".rs")].split(os.sep)
    if parts[-1] == "mod" or (len(parts) == 1 and parts[0] in ("lib", "main")):
        parts = parts[:-1]
    return tuple(parts)


def load_crate(src):
    modules, test_children = {}, set()
    for root, _, files in os.walk(src):
        for name in sorted(files):
            file = os.path.join(root, name)
            if not name.endswith(".rs") or name == "tests.rs" or f"{os.sep}tests{os.sep}" in file:
                continue
            if os.path.relpath(file, src).startswith("bin" + os.sep):
                continue  # each file there is a crate of its own
            mod = Module(module_path(src, file), file)
            with open(file, encoding="utf-8") as f:
                text, tests = remove_test_items(strip_comments_and_strings(f.read()))
            mod.text = text
            test_children.update(mod.path + (t,) for t in tests)
            modules[mod.path] = mod
    # Drop the modules declared under #[cfg(test)] and everything below them.
    for path in list(modules):
        if any(path[: len(t)] == t for t in test_children):
            del modules[path]
    return modules


def absolute(modules, here, segments):
    """The path from the crate root that `segments`, written in module `here`, names; None for
    another crate's path."""
    first = segments[0]
    if first == "crate":
        base, rest = (), segments[1:]
    elif first in ("self", "super"):
        base, rest = here, segments
        while rest and rest[0] in ("self", "super"):
            if rest[0] == "super":
                base = base[:-1]
            rest = rest[1:]
    elif here + (first,) in modules:
        base, rest = here, segments
    else:
        return None
    return tuple(base) + tuple(rest)


def scan(modules):
    for mod in modules.values():
        text = mod.text
        breaks = [m.start() for m in re.finditer("\n", text)]

        def line_at(offset):
            return bisect.bisect_left(breaks, offset) + 1

        for m in USE_RE.finditer(text):
            line = line_at(m.start(2))
            for segments, bound in parse_use_tree(m.group(2)):
                if not segments or segments[0] == "*":
                    continue
                target = absolute(modules, mod.path, segments)
                if target is None:
                    continue
                mod.refs.append((target, line))
                if bound and target[-1] != "*":
                    mod.uses.setdefault(bound, (target, line))
        # Paths written in code, outside the `use` declarations.
        text = USE_RE.sub(lambda m: blank_keeping_lines(m.group(0)), text)
        for m in re.finditer(r"(?<![\w$])((?:crate|self|super)(?:::" + IDENT + r")+)", text):
            segments = m.group(1).split("::")
            if segments[0] == "self" and len(segments) < 2:
                continue
            target = absolute(modules, mod.path, segments)
            if target is not None:
                mod.refs.append((target, line_at(m.start())))


def defining_module(modules, path, depth=0):
    """The module that defines what `path` names: its longest module prefix, or, where the next
    name is bound there by a `use`, wherever that leads."""
    for cut in range(len(path), -1, -1):
        if path[:cut] in modules:
            break
    else:
        return None
    home, rest = path[:cut], path[cut:]
    if rest and rest[0] != "*" and depth < 32:
        bound = modules[home].uses.get(rest[0])
        if bound and bound[0] != path:
            return defining_module(modules, bound[0] + rest[1:], depth + 1) or home
    return home


def related(a, b):
    return a[: len(b)] == b or b[: len(a)] == a


def edges(modules):
    """{module: {module it depends on: first line that says so}}, a module and its ancestors and
    descendants left out."""
    graph = {}
    for mod in modules.values():
        for target, line in mod.refs:
            home = defining_module(modules, target)
            if home is None or related(home, mod.path):
                continue
            graph.setdefault(mod.path, {}).setdefault(home, f"{mod.file}:{line}")
    return graph


# ---- loops -------------------------------------------------------------------------------------


def strongly_connected(nodes, succ):
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in succ.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def level_loops(modules, graph):
    """For each module (the root included), the circles among its children's subtrees: yields
    (parent, [child, ...], [(child, child, file:line), ...])."""
    parents = {p[:-1] for p in modules if p} | {()}
    for parent in sorted(parents):
        depth = len(parent) + 1
        succ, why = {}, {}
        for src_mod, targets in graph.items():
            if len(src_mod) < depth or src_mod[: len(parent)] != parent:
                continue
            a = src_mod[depth - 1]
            for dst_mod, where in targets.items():
                if len(dst_mod) < depth or dst_mod[: len(parent)] != parent:
                    continue
                b = dst_mod[depth - 1]
                if a != b:
                    succ.setdefault(a, set()).add(b)
                    why.setdefault((a, b), []).append(where)
        for group in strongly_connected(set(succ), succ):
            members = set(group)
            lines = [
                (a, b, where)
                for (a, b), places in sorted(why.items())
                if a in members and b in members
                for where in sorted(places)
            ]
            yield parent, group, lines


def shown(parent, child):
    return "::".join(parent + (child,))


def main_on(root):
    """Checks every crate under `root`; 1 when a loop was found."""
    bad = 0
    for crate in sorted(os.listdir(root)):
        src = os.path.join(root, crate, "src")
        if not os.path.isdir(src):
            continue
        modules = load_crate(src)
        scan(modules)
        graph = edges(modules)
        for parent, group, lines in level_loops(modules, graph):
            bad += 1
            names = ", ".join(shown(parent, c) for c in group)
            print(f"{crate}: module loop between {names}")
            for a, b, where in lines:
                print(f"  {shown(parent, a)} -> {shown(parent, b)} at {where}")
    if bad:
        print("move what both sides need into a module of its own (docs/design.md)")
        return 1
    print("module-loops: no loop between the modules of any crate")
    return 0


def main():
    return main_on(sys.argv[1] if len(sys.argv) > 1 else "crates")


if __name__ == "__main__":
    sys.exit(main())
