"""Keeps the Bazel BUILD files in step with the Python files they describe.

Fast and pure Python (no Bazel, no TensorFlow): runs under pytest and under `bazel test`. It reads
the BUILD files of the repo root, ps_trainer/ and tests/ (Starlark close enough to Python to be run
with stand-in rule functions) and fails, naming the file and the fix, when:
  - a ps_trainer/ module has no py_library (or, for __main__.py, the py_binary);
  - a tests/test_*.py file has no py_test, or its py_test has no size;
  - a test helper in tests/ has no py_library;
  - a target names a file or target that does not exist;
  - a file imports a module of this repo that is neither in its own target nor a direct dep;
  - a file names a data file of the repo (e.g. "digits.npz", "launch.sh") in a string literal that
    is not in its target's runfiles (its own or its deps' `data`), or runs `python -m ps_trainer`
    without the py_binary //ps_trainer in its runfiles.

Under Bazel the repo is the test's runfiles tree: each BUILD's `all_files` filegroup puts every
file of its package there, so a new file is seen (and re-tested) without editing this test.
"""

import collections
import os
from typing import List, Optional

from absl.testing import absltest

from build_graph import (PACKAGE_DIR, PACKAGE_INIT, PACKAGES, PY_RULES, SIZES, UNTARGETED,
                         BuildGraph, imported_modules, rel, repo_root, runs_package,
                         string_literals, walk_files)


class BuildFileTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = repo_root()
    cls.graph = BuildGraph(cls.root)
    cls.files = sorted(walk_files(cls.root))

  def _report(self, problems: List[str]) -> None:
    if problems:
      self.fail("BUILD files out of step with the code (see tests/BUILD, ps_trainer/BUILD):\n  "
                + "\n  ".join(sorted(set(problems))))

  def _read(self, path: str) -> str:
    with open(os.path.join(self.root, path), encoding="utf-8") as f:
      return f.read()

  def _py_files(self, prefix: str) -> List[str]:
    return [f for f in self.files if f.startswith(prefix) and f.endswith(".py")]

  def _module_path(self, module: str, importer: str) -> Optional[str]:
    """The repo file of a dotted module name, or None for third-party/stdlib modules."""
    candidates = [module.replace(".", "/")]
    if importer.startswith("tests/") and "." not in module:
      candidates.append("tests/" + module)  # tests import siblings: `import testutil`
    for base in candidates:
      for path in (base + ".py", base + "/__init__.py"):
        if path in self.files and path not in UNTARGETED:
          return path
    return None

  def test_build_files_parse(self):
    self._report(self.graph.errors)

  def test_every_module_has_a_library(self):
    missing = []
    for path in self._py_files("ps_trainer/"):
      kinds = ("py_library", "py_binary") if path.endswith("/__main__.py") else ("py_library",)
      owners = self.graph.owners(path, kinds)
      if not owners:
        missing.append(f"{path}: add a py_library to ps_trainer/BUILD (srcs = "
                       f"[\"{os.path.relpath(path, 'ps_trainer')}\"], deps = its imports)")
      libs = [r.label for r in owners if r.kind == "py_library"]
      if len(libs) > 1:
        missing.append(f"{path} is in the srcs of several py_library targets: {libs}")
    self._report(missing)

  def test_binary(self):
    rule = self.graph.rules.get(("ps_trainer", "ps_trainer"))
    self.assertIsNotNone(rule, "ps_trainer/BUILD needs the py_binary ps_trainer")
    self.assertEqual(rule.kind, "py_binary")
    self.assertEqual(rule.attrs.get("main"), "__main__.py")

  def test_every_test_file_has_a_sized_py_test(self):
    problems = []
    for path in self._py_files("tests/"):
      name = os.path.basename(path)
      if path in UNTARGETED or "/" in os.path.relpath(path, "tests"):
        continue
      if name.startswith("test_"):
        tests = self.graph.owners(path, ("py_test",))
        if not tests:
          problems.append(f"{path}: add a py_test to tests/BUILD with a size "
                          f"(small: unit; medium: in-process cluster; large: multi-process)")
        for rule in tests:
          if rule.attrs.get("size") not in SIZES:
            problems.append(f"{rule.label}: set size to one of {SIZES}")
      elif not self.graph.owners(path, ("py_library",)):
        problems.append(f"{path}: test helper without a py_library (testonly) in tests/BUILD")
    self._report(problems)

  def test_every_py_test_runs_one_test_file(self):
    problems = []
    for rule in self.graph.rules.values():
      if rule.kind != "py_test":
        continue
      srcs = rule.list_attr("srcs")
      if len(srcs) != 1 or not os.path.basename(srcs[0]).startswith("test_"):
        problems.append(f"{rule.label}: srcs must be the one test_*.py file it runs "
                        f"(helpers go in deps), not {srcs}")
      if rule.attrs.get("size") not in SIZES:
        problems.append(f"{rule.label}: set size to one of {SIZES}")
    self._report(problems)

  def test_named_files_and_targets_exist(self):
    problems = []
    for rule in self.graph.rules.values():
      for attr in ("srcs", "deps", "data", "main"):
        for label in rule.list_attr(attr):
          target = self.graph.resolve(label, rule.package)
          if target is None:
            continue
          if target[0] not in PACKAGES:
            problems.append(f"{rule.label}: {attr} names {label}, outside the packages "
                            f"{PACKAGES} this test knows")
          elif attr == "deps" and self.graph.is_file(target):
            problems.append(f"{rule.label}: deps names {label}, which is no target")
          elif self.graph.is_file(target) and self.graph.file_path(target) not in self.files:
            problems.append(f"{rule.label}: {attr} names {label}, which does not exist")
    self._report(problems)

  def test_imports_are_direct_deps(self):
    problems = []
    for rule in self.graph.rules.values():
      if rule.kind not in PY_RULES:
        continue
      direct = {(rule.package, rule.name)}
      for label in rule.list_attr("deps"):
        target = self.graph.resolve(label, rule.package)
        if target:
          direct.add(target)
      runfiles = self.graph.closure(rule)
      for src in self.graph.closure(rule, attrs=("srcs",)):
        if not src.endswith(".py") or src not in self.files:
          continue
        paths = {m: self._module_path(m, src) for m in imported_modules(src, self._read(src))}
        in_package = src.startswith(PACKAGE_DIR) or any(
            p and p.startswith(PACKAGE_DIR) for p in paths.values())
        if in_package and PACKAGE_INIT not in runfiles:
          problems.append(f"{rule.label}: add //ps_trainer:package to deps ({PACKAGE_INIT})")
        for module, path in sorted(paths.items()):
          # The package's __init__.py is checked above: it is needed, not necessarily directly.
          if path is None or path == src or path == PACKAGE_INIT:
            continue
          owners = self.graph.owners(path, ("py_library",))
          if owners and not any((o.package, o.name) in direct for o in owners):
            want = " or ".join(o.label for o in owners)
            problems.append(f"{rule.label}: {src} imports {module}: add {want} to deps")
    self._report(problems)

  def test_data_files_named_in_code_are_in_runfiles(self):
    # The candidates: every non-Python file of the packages (their all_files filegroups).
    data_files = set()
    for package in PACKAGES:
      rule = self.graph.rules.get((package, "all_files"))
      self.assertIsNotNone(rule, f"{rel(package, 'BUILD')}: needs the filegroup all_files")
      data_files |= {f for f in self.graph.closure(rule) if not f.endswith(".py")}
    by_name = collections.defaultdict(set)
    for f in data_files:
      by_name[f].add(f)
      by_name[os.path.basename(f)].add(f)
    problems = []
    for rule in self.graph.rules.values():
      if rule.kind not in PY_RULES:
        continue
      runfiles = self.graph.closure(rule)
      for src in self.graph.closure(rule, attrs=("srcs",)):
        if not src.endswith(".py") or src not in self.files:
          continue
        source = self._read(src)
        if runs_package(source, src) and "ps_trainer/__main__.py" not in runfiles:
          problems.append(f"{rule.label}: {src} runs `python -m ps_trainer`: "
                          "add //ps_trainer (the py_binary) to data")
        for literal in sorted(string_literals(source, src)):
          wanted = by_name.get(literal[2:] if literal.startswith("./") else literal)
          if wanted and not wanted & runfiles:
            problems.append(f"{rule.label}: {src} names {literal!r}: add "
                            f"{' or '.join(sorted(wanted))} to data (of it or a dep)")
    self._report(problems)


if __name__ == "__main__":
  absltest.main()
