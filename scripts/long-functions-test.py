#!/usr/bin/env python3
"""Tests of scripts/long-functions.py on small crates written to a temporary folder."""

import contextlib
import importlib.util
import io
import os
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("long_functions", os.path.join(HERE, "long-functions.py"))
long_functions = importlib.util.module_from_spec(spec)
spec.loader.exec_module(long_functions)


def body(lines):
    return "".join(f"    let x{i} = {i}; // {{ not a brace\n" for i in range(lines))


def run(files, limit=10):
    """Writes `files` (path under src → text) as crate `c` and runs the script on it."""
    with tempfile.TemporaryDirectory() as root:
        for path, text in files.items():
            full = os.path.join(root, "c", "src", path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8") as f:
                f.write(text)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = long_functions.main_on(root, limit)
        return code, out.getvalue().replace(root + os.sep, "")


class LongFunctions(unittest.TestCase):
    def test_a_long_function_without_a_reason_fails_naming_it(self):
        code, out = run({"lib.rs": "/// Docs.\npub fn long() {\n" + body(12) + "}\n"})
        self.assertEqual(code, 1, out)
        self.assertIn("c/src/lib.rs:2: fn long is 14 lines (over 10)", out)

    def test_a_reason_among_the_docs_and_attributes_passes(self):
        text = "/// Docs.\n// Long: one match over the operations\n#[inline]\nfn long() {\n" + body(12) + "}\n"
        code, out = run({"lib.rs": text})
        self.assertEqual(code, 0, out)

    def test_a_reason_of_another_function_does_not_count(self):
        text = "// Long: the first one's\nfn short() {}\n\nfn long() {\n" + body(12) + "}\n"
        code, out = run({"lib.rs": text})
        self.assertEqual(code, 1, out)
        self.assertIn("fn long is", out)

    def test_short_functions_and_test_code_pass(self):
        text = "fn short() {\n" + body(3) + "}\n\n#[cfg(test)]\nmod t {\n    fn long() {\n" + body(12) + "    }\n}\n"
        code, out = run({"lib.rs": text, "a/tests.rs": "fn long() {\n" + body(12) + "}\n"})
        self.assertEqual(code, 0, out)


if __name__ == "__main__":
    unittest.main()
