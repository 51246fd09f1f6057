"""The BUILD files of this repo and the Python files they describe, read for test_build_file.py.

BuildGraph runs each package's BUILD file (Starlark close enough to Python) with stand-in rule
functions; the functions below read a Python file's imports and string literals, and find the
repo's files, under a checkout or under `bazel test`'s runfiles tree.
"""

import ast
import os
import re
from typing import Dict, Iterable, List, Optional, Set, Tuple

# Packages (directories with a BUILD file) test_build_file.py reads; "" is the repo root.
PACKAGES = ("", "ps_trainer", "tests")
PY_RULES = ("py_library", "py_binary", "py_test")
SIZES = ("small", "medium", "large", "enormous")
# Files that need no target: pytest-only configuration and package markers of tests/.
UNTARGETED = ("tests/__init__.py", "tests/conftest.py", "conftest.py")
# Directories never scanned for files.
SKIP_DIRS = (".git", ".venv", "__pycache__", ".pytest_cache", "runs")
PACKAGE_DIR = "ps_trainer/"
PACKAGE_INIT = "ps_trainer/__init__.py"


def repo_root() -> str:
  """The repo: under `bazel test` the runfiles tree of this test, else the checkout."""
  srcdir, workspace = os.environ.get("TEST_SRCDIR"), os.environ.get("TEST_WORKSPACE")
  if srcdir and workspace:
    return os.path.join(srcdir, workspace)
  return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


Label = Tuple[str, str]  # (package, name)


class Rule:
  """One rule call of a BUILD file."""

  def __init__(self, kind: str, package: str, attrs: dict):
    self.kind = kind
    self.package = package
    self.attrs = attrs
    self.name = attrs.get("name", "")

  @property
  def label(self) -> str:
    return f"//{self.package}:{self.name}"

  def list_attr(self, key: str) -> List[str]:
    value = self.attrs.get(key, [])
    if isinstance(value, str):
      return [value]
    return list(value)


class _BuildNamespace(dict):
  """Locals of a BUILD file's exec: any unknown name is a rule that gets recorded."""

  def __init__(self, package: str, root: str, rules: List[Rule]):
    super().__init__()
    self._package, self._root, self._rules = package, root, rules
    self.update(load=lambda *a, **k: None, package=lambda **k: None, glob=self._glob,
                select=lambda d: d.get("//conditions:default", []))

  def __missing__(self, kind: str):
    if kind.startswith("__"):
      raise KeyError(kind)

    def rule(**attrs):
      if kind == "exports_files":
        return
      self._rules.append(Rule(kind, self._package, attrs))

    return rule

  def _glob(self, include, exclude=(), exclude_directories=1, allow_empty=True):
    del exclude_directories, allow_empty
    found = []
    for rel in _package_files(self._root, self._package):
      if any(_glob_match(rel, p) for p in include) and not any(
          _glob_match(rel, p) for p in exclude):
        found.append(rel)
    return sorted(found)


def _glob_match(path: str, pattern: str) -> bool:
  """Bazel glob semantics: `*` stays within a directory, `**` spans any number of them."""
  parts = pattern.split("/")
  regex = ""
  for i, part in enumerate(parts):
    last = i == len(parts) - 1
    if part == "**":
      regex += "[^/]+(?:/[^/]+)*" if last else "(?:[^/]+/)*"
      continue
    regex += "".join("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c) for c in part)
    regex += "" if last else "/"
  return re.fullmatch(regex, path) is not None


def walk_files(root: str) -> Iterable[str]:
  """Every file under root, repo-relative, skipping SKIP_DIRS and bazel-* output links."""
  for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
    rel_dir = os.path.relpath(dirpath, root)
    rel_dir = "" if rel_dir == "." else rel_dir
    dirnames[:] = [d for d in dirnames
                   if d not in SKIP_DIRS and not (not rel_dir and d.startswith("bazel-"))
                   and not d.endswith(".runfiles")]
    for f in filenames:
      yield os.path.join(rel_dir, f) if rel_dir else f


def _package_files(root: str, package: str) -> List[str]:
  """The files of one package, relative to it (not descending into sub-packages)."""
  base = os.path.join(root, package)
  out = []
  for rel in walk_files(base):
    parts = rel.split("/")
    inner = any(os.path.exists(os.path.join(base, *parts[:i], "BUILD"))
                for i in range(1, len(parts)))
    if not inner:
      out.append(rel)
  return out


class BuildGraph:
  """The parsed BUILD files of PACKAGES, with label resolution and runfiles closures."""

  def __init__(self, root: str):
    self.root = root
    self.rules: Dict[Label, Rule] = {}
    self.errors: List[str] = []
    for package in PACKAGES:
      path = os.path.join(root, package, "BUILD")
      if not os.path.exists(path):
        self.errors.append(f"{rel(package, 'BUILD')} is missing")
        continue
      with open(path, encoding="utf-8") as f:
        source = f.read()
      found: List[Rule] = []
      exec(compile(source, path, "exec"), {"__builtins__": {}},  # pylint: disable=exec-used
           _BuildNamespace(package, root, found))
      for rule in found:
        if (package, rule.name) in self.rules:
          self.errors.append(f"{rule.label} is defined twice")
        self.rules[(package, rule.name)] = rule

  def resolve(self, label: str, package: str) -> Optional[Label]:
    """(package, name) of a label written in `package`; None for external repositories."""
    if label.startswith("@"):
      return None
    if label.startswith("//"):
      pkg, _, name = label[2:].partition(":")
      return pkg, name or pkg.rsplit("/", 1)[-1]
    return package, label.lstrip(":")

  def is_file(self, label: Label) -> bool:
    return label not in self.rules

  def file_path(self, label: Label) -> str:
    return rel(*label)

  def closure(self, rule: Rule, attrs=("srcs", "deps", "data", "main")) -> Set[str]:
    """Repo-relative files in the runfiles of rule: its own, and its deps' and data's."""
    files: Set[str] = set()
    seen: Set[Label] = set()
    todo = [(rule.package, rule.name)]
    while todo:
      key = todo.pop()
      if key in seen:
        continue
      seen.add(key)
      current = self.rules[key]
      for attr in attrs:
        for label in current.list_attr(attr):
          target = self.resolve(label, current.package)
          if target is None:
            continue
          if self.is_file(target):
            files.add(self.file_path(target))
          else:
            todo.append(target)
    return files

  def owners(self, path: str, kinds=PY_RULES) -> List[Rule]:
    """The rules of the given kinds that have path in their srcs."""
    out = []
    for rule in self.rules.values():
      if rule.kind in kinds:
        for label in rule.list_attr("srcs"):
          target = self.resolve(label, rule.package)
          if target and self.is_file(target) and self.file_path(target) == path:
            out.append(rule)
    return out


def rel(package: str, name: str) -> str:
  return f"{package}/{name}" if package else name


def imported_modules(path: str, source: str) -> Set[str]:
  """Dotted names of every module path imports (top level or deferred), relative ones resolved."""
  tree = ast.parse(source, path)
  package = os.path.dirname(path).replace("/", ".")
  names: Set[str] = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        parts = package.split(".") if package else []
        base_parts = parts[:len(parts) - node.level + 1]
        base = ".".join(base_parts + ([node.module] if node.module else []))
      else:
        base = node.module or ""
      names.add(base)
      # `from pkg import mod` imports pkg.mod when it is a module.
      names.update(f"{base}.{alias.name}" for alias in node.names)
  return names


def string_literals(source: str, path: str) -> Set[str]:
  return {node.value for node in ast.walk(ast.parse(source, path))
          if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def runs_package(source: str, path: str) -> bool:
  """Whether code runs `python -m ps_trainer`: "-m", "ps_trainer" side by side in a list,
  tuple or call, or "-m ps_trainer" in a string that is not a docstring."""
  tree = ast.parse(source, path)
  docstrings = set()
  for node in ast.walk(tree):
    body = getattr(node, "body", None)
    if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(
        body[0].value, ast.Constant):
      docstrings.add(id(body[0].value))
  for node in ast.walk(tree):
    items = (node.elts if isinstance(node, (ast.List, ast.Tuple))
             else node.args if isinstance(node, ast.Call) else [])
    values = [i.value if isinstance(i, ast.Constant) else None for i in items]
    if any(a == "-m" and b == "ps_trainer" for a, b in zip(values, values[1:])):
      return True
    if (isinstance(node, ast.Constant) and isinstance(node.value, str)
        and id(node) not in docstrings and re.search(r"-m\s+ps_trainer\b", node.value)):
      return True
  return False
