#!/usr/bin/env python3
"""Fails when a function of non-test code is longer than 80 lines (its signature to its closing
brace) and no `// Long: <why>` comment stands right above it (among its doc comments and
attributes): a long function is split where it reads as steps, or says why it stays whole
(one `match` over a protocol's operations, a `select!` loop whose arms share state).

Test code is left out as scripts/module-loops.py leaves it out (`#[cfg(test)]` items, `tests.rs`
files and `tests/` folders), and so are comments and string literals when counting braces. An
argument names the folder of crates (default `crates`); `--limit N` sets the length."""

import importlib.util
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("module_loops", os.path.join(HERE, "module-loops.py"))
module_loops = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module_loops)

LIMIT = 80
FN_RE = re.compile(r"\bfn\s+(" + module_loops.IDENT + r")\b[^;{]*\{")
REASON_RE = re.compile(r"^\s*//\s*Long:\s*\S")
# What may stand between a function and its reason: docs, attributes, comments.
ABOVE_RE = re.compile(r"^\s*(///|//|#\[|#!\[)")


def has_reason(lines, fn_line):
    """Whether a `// Long:` comment is in the block of docs, attributes and comments right
    above line `fn_line` (0-based) of `lines`."""
    i = fn_line - 1
    while i >= 0 and ABOVE_RE.match(lines[i]):
        if REASON_RE.match(lines[i]):
            return True
        i -= 1
    return False


def long_functions(src, limit):
    """(file, line, name, length) of each function of crate source folder `src` over `limit`
    lines without a reason."""
    found = []
    for mod in module_loops.load_crate(src).values():
        with open(mod.file, encoding="utf-8") as f:
            lines = f.read().split("\n")
        text = mod.text
        for m in FN_RE.finditer(text):
            end = module_loops.matching_brace(text, m.end() - 1)
            length = text.count("\n", m.start(), end) + 1
            if length <= limit:
                continue
            line = text.count("\n", 0, m.start())
            # The signature may start on an earlier line (`pub async`): the line of `fn` is
            # where rustfmt puts it too, so the block above starts there.
            if not has_reason(lines, line):
                found.append((mod.file, line + 1, m.group(1), length))
    return found


def main_on(root, limit=LIMIT):
    """Checks every crate under `root`; 1 when a function is too long without a reason."""
    bad = []
    for crate in sorted(os.listdir(root)):
        src = os.path.join(root, crate, "src")
        if os.path.isdir(src):
            bad += long_functions(src, limit)
    for file, line, name, length in sorted(bad):
        print(
            f"{file}:{line}: fn {name} is {length} lines (over {limit}): split it where it reads "
            "as steps, or write `// Long: <why>` right above it"
        )
    if bad:
        return 1
    print(f"long-functions: every function of non-test code is at most {limit} lines or says why")
    return 0


def main():
    args = sys.argv[1:]
    limit = LIMIT
    if "--limit" in args:
        i = args.index("--limit")
        limit = int(args[i + 1])
        del args[i : i + 2]
    return main_on(args[0] if args else "crates", limit)


if __name__ == "__main__":
    sys.exit(main())
