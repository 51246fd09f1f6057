"""Which test files share the machine when `./launch.sh test` runs the suite on two workers.

`./launch.sh test` runs pytest with two pytest-xdist workers and `--dist loadgroup`, and
tests/conftest.py hands xdist the scheduler made here (in place of loadgroup's own, which groups
by xdist_group marks; the tests here carry none). Each test file is a group of its own, run whole
on one worker (its class fixtures, such as an in-process cluster, are set up once), except the
files whose py_test in tests/BUILD is tagged "exclusive": those start several TensorFlow
processes each, with bounded waits, so they form one group that one worker runs one after
another. No two of them run at once; each shares the machine with at most one file of
single-process tests, which the other worker runs meanwhile (Bazel runs them alone). xdist hands
out the groups with the most tests first (its default --loadscope-reorder), two to each worker,
and this one (about 60 tests, as many as the largest single files) is among the first three, so
it starts within seconds, after at most one other file; once it is done, both workers take the
files left. The scheduler overrides xdist's `_split_scope`, not a public API: hence the pinned
pytest-xdist in requirements-dev.txt.
"""

import os
from typing import Callable, Set

from build_graph import BuildGraph, Rule

MULTI_PROCESS_GROUP = "multi-process test files"


def py_test_files(root: str, keep: Callable[[Rule], bool]) -> Set[str]:
  """The paths, relative to root, of the test files of the py_test rules that `keep` keeps."""
  return {os.path.join(rule.package, src)
          for rule in BuildGraph(root).rules.values()
          if rule.kind == "py_test" and keep(rule)
          for src in rule.list_attr("srcs")}


def exclusive_test_files(root: str) -> Set[str]:
  """The paths, relative to root, of the test files whose py_test is tagged exclusive."""
  return py_test_files(root, lambda rule: "exclusive" in rule.list_attr("tags"))


def group_of(nodeid: str, exclusive: Set[str]) -> str:
  """The group of a test: its file's path, or MULTI_PROCESS_GROUP for an exclusive file."""
  path = nodeid.split("::", 1)[0]
  return MULTI_PROCESS_GROUP if path in exclusive else path


def make_scheduler(config, log, root: str):
  """xdist's file scheduler, with groups of group_of instead of one group per file."""
  # Imported here: only xdist's controller calls this, and only where pytest-xdist is installed.
  from xdist.scheduler import LoadFileScheduling  # pylint: disable=import-outside-toplevel

  # Nodeids are relative to pytest's rootdir, which a -c or --rootdir may set apart from root.
  exclusive = {os.path.relpath(os.path.join(root, path), str(config.rootpath))
               for path in exclusive_test_files(root)}

  class FileOrMultiProcessGroup(LoadFileScheduling):

    def _split_scope(self, nodeid: str) -> str:
      return group_of(nodeid, exclusive)

  return FileOrMultiProcessGroup(config, log)
