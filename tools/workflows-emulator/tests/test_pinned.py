"""wfemu_lib replaces internals of the pinned workflows-emulator; before patching anything it checks that the
installed package is that version with every internal it touches as expected, and fails in one line if not."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from support import HERE
from wfemu_lib import patches, pinned

ROOT = os.path.dirname(HERE)


class PinnedVersion(unittest.TestCase):
    def test_the_pin_is_read_from_requirements_txt_and_is_what_is_installed(self):
        self.assertRegex(pinned.pinned_version(), r"^\d+\.\d+\.\d+$")
        self.assertEqual(pinned.installed_version(), pinned.pinned_version())

    def test_another_installed_version_fails_in_one_line_naming_both(self):
        with self.assertRaises(pinned.Mismatch) as caught:
            pinned.check(installed="1.11.0", pinned="1.10.0")
        message = str(caught.exception)
        self.assertIn("workflows-emulator 1.11.0 is installed", message)
        self.assertIn("patches 1.10.0", message)
        self.assertNotIn("\n", message)

    def test_a_requirements_file_without_the_pin_is_refused(self):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("PyYAML==6.0.4\n")
        try:
            with self.assertRaisesRegex(pinned.Mismatch, "pins no workflows-emulator"):
                pinned.pinned_version(f.name)
        finally:
            os.unlink(f.name)


class PatchedSymbols(unittest.TestCase):
    def test_a_missing_symbol_is_named(self):
        found = list(pinned.problems({"workflows_emulator.main.StepRetry.no_such_method": "(self)"}, "patched"))
        self.assertEqual(found, [("workflows_emulator.main.StepRetry.no_such_method",
                                  "patched symbol workflows_emulator.main.StepRetry.no_such_method is missing")])

    def test_a_missing_module_is_named(self):
        [(symbol, message)] = pinned.problems({"workflows_emulator.no_such_module.f": "()"}, "used")
        self.assertEqual(message, "used symbol workflows_emulator.no_such_module.f is missing")

    def test_a_function_with_other_parameters_is_named_with_both_signatures(self):
        [(_, message)] = pinned.problems({"workflows_emulator.render.run_code": "(code)"}, "used")
        self.assertEqual(message, "used symbol workflows_emulator.render.run_code is (code, context), expected (code)")

    def test_shapes_name_parameters_with_their_stars_classes_and_other_kinds(self):
        def f(a, *b, c=1, **d):
            pass

        self.assertEqual([pinned.shape(f), pinned.shape(int), pinned.shape({}), pinned.shape(3)],
                         ["(a, *b, c, **d)", "class", "dict", "int"])

    def test_every_replacement_patches_installs_is_a_checked_symbol_and_every_checked_one_is_installed(self):
        self.assertEqual(sorted(patches.APPLIED), sorted(pinned.PATCHED))

    def test_the_unpatched_package_passes_the_check(self):
        # In a fresh interpreter: here the patches are installed, and the patched symbols have our shapes.
        code = "import sys; sys.path.insert(0, sys.argv[1]); from wfemu_lib import pinned; pinned.check(); print('ok')"
        out = subprocess.run([sys.executable, "-c", code, ROOT], capture_output=True, text=True, check=False)
        self.assertEqual((out.returncode, out.stdout.strip(), out.stderr), (0, "ok", ""))


class Startup(unittest.TestCase):
    def test_wfemu_py_refuses_to_start_on_another_version_with_one_line_on_stderr(self):
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(os.path.join(ROOT, "wfemu.py"), tmp)
            shutil.copytree(os.path.join(ROOT, "wfemu_lib"), os.path.join(tmp, "wfemu_lib"),
                            ignore=shutil.ignore_patterns("__pycache__"))
            with open(os.path.join(tmp, "requirements.txt"), "w") as f:
                f.write("workflows-emulator==0.0.1\n")
            out = subprocess.run([sys.executable, os.path.join(tmp, "wfemu.py"), "--help"], capture_output=True,
                                 text=True, check=False)
        self.assertEqual(out.returncode, 1)
        self.assertEqual(out.stdout, "")
        lines = out.stderr.splitlines()
        self.assertEqual(len(lines), 1, out.stderr)
        self.assertIn(f"workflows-emulator {pinned.installed_version()} is installed but wfemu_lib patches 0.0.1", lines[0])


if __name__ == "__main__":
    unittest.main()
