#!/usr/bin/env python3
"""Tests of scripts/module-loops.py on small crates written to a temporary folder: each case is a
crate whose loops (or lack of them) are known, checked against what the script reports."""

import contextlib
import importlib.util
import io
import os
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("module_loops", os.path.join(HERE, "module-loops.py"))
module_loops = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module_loops)


def run(files):
    """Writes `files` (path under src → text) as crate `c` and runs the script on it: its exit
    code and output."""
    with tempfile.TemporaryDirectory() as root:
        for path, text in files.items():
            full = os.path.join(root, "c", "src", path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8") as f:
                f.write(textwrap.dedent(text))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = module_loops.main_on(root)
        return code, out.getvalue().replace(root + os.sep, "")


class ModuleLoops(unittest.TestCase):
    def assert_loop(self, files, members, *lines):
        code, out = run(files)
        self.assertEqual(code, 1, out)
        self.assertIn(f"c: module loop between {members}", out)
        for line in lines:
            self.assertIn(line, out)

    def assert_clean(self, files):
        code, out = run(files)
        self.assertEqual(code, 0, out)
        self.assertIn("no loop", out)

    def test_two_sibling_files_that_import_each_other(self):
        self.assert_loop(
            {
                "lib.rs": "mod run;\n",
                "run.rs": "mod session;\nmod on_create;\n",
                "run/session.rs": "use super::on_create::prepare;\npub struct Stop;\n",
                "run/on_create.rs": "\n\nuse super::session::Stop;\npub fn prepare() {}\n",
            },
            "run::on_create, run::session",
            "run::on_create -> run::session at c/src/run/on_create.rs:3",
            "run::session -> run::on_create at c/src/run/session.rs:1",
        )

    def test_a_parent_and_its_children_are_one_unit(self):
        self.assert_clean(
            {
                "lib.rs": "mod route;\n",
                "route.rs": "mod native;\nmod config;\npub use config::Config;\nfn f() { native::plan(); }\n",
                "route/config.rs": "pub struct Config;\nuse super::Shared;\n",
                "route/native.rs": "use super::Config;\npub fn plan() {}\n",
            }
        )

    def test_a_loop_through_the_parents_reexport_is_followed_to_the_file(self):
        self.assert_loop(
            {
                "lib.rs": "mod route;\npub use route::Config;\n",
                "route.rs": "mod native;\nmod config;\npub use config::Config;\n",
                "route/config.rs": "pub struct Config { c: Option<super::native::Cloud> }\n",
                "route/native.rs": "use crate::Config;\npub struct Cloud;\n",
            },
            "route::config, route::native",
            "route::native -> route::config at c/src/route/native.rs:1",
        )

    def test_brace_groups_self_and_paths_in_code(self):
        self.assert_loop(
            {
                "lib.rs": "mod a;\nmod b;\nmod c;\n",
                "a.rs": "use crate::{c, b::{self, Thing as Other}};\n",
                "b.rs": "pub struct Thing;\n",
                "c.rs": "fn f() { let _ = crate::a::g(); }\n",
            },
            "a, c",
            "a -> c at c/src/a.rs:1",
            "c -> a at c/src/c.rs:1",
        )

    def test_test_code_comments_and_strings_are_left_out(self):
        self.assert_clean(
            {
                "lib.rs": "mod a;\nmod b;\n#[cfg(test)]\nmod props;\n",
                "a.rs": "use crate::b::B;\n",
                "b.rs": textwrap.dedent(
                    """\
                    pub struct B;
                    // crate::a::A is where this came from
                    /* use crate::a::A; */
                    const S: &str = "crate::a::A";
                    const R: &str = r#"use crate::a::A;"#;
                    #[cfg(test)]
                    mod tests {
                        use crate::a::A;
                    }
                    #[cfg(test)]
                    fn helper() { crate::a::f(); }
                    """
                ),
                "props.rs": "use crate::a::A;\nuse crate::b::B;\n",
                "b/tests.rs": "use crate::a::A;\n",
            }
        )

    def test_folders_whose_files_import_each_other_in_a_circle(self):
        self.assert_loop(
            {
                "lib.rs": "mod a;\nmod b;\n",
                "a.rs": "mod x;\nmod w;\n",
                "a/x.rs": "use crate::b::y::Y;\n",
                "a/w.rs": "pub struct W;\n",
                "b.rs": "pub mod y;\nmod z;\n",
                "b/y.rs": "pub struct Y;\n",
                "b/z.rs": "use crate::a::w::W;\n",
            },
            "a, b",
            "a -> b at c/src/a/x.rs:1",
            "b -> a at c/src/b/z.rs:1",
        )

    def test_a_one_way_chain_is_no_loop(self):
        self.assert_clean(
            {
                "lib.rs": "mod a;\nmod b;\nmod c;\n",
                "a.rs": "use crate::b::B;\n",
                "b.rs": "use crate::c::C;\npub struct B;\n",
                "c.rs": "pub struct C;\nfn f(x: &'static str) -> char { 'a' }\n",
            }
        )


if __name__ == "__main__":
    unittest.main()
