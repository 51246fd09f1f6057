"""pytest only: which test files share the machine when `./launch.sh test` runs two workers.

`./launch.sh test` runs the suite on two pytest-xdist workers with `--dist loadgroup`, whose
groups this file sets: each test file is a group of its own, run whole on one worker (its class
fixtures, such as an in-process cluster, are set up once), except the files whose py_test in
tests/BUILD is tagged "exclusive". Those start several TensorFlow processes each, with bounded
waits sized for a machine that no other such file shares, so they form one group: one worker runs
them one after another while the other runs the rest. xdist hands out the groups with the most
tests first, and this one (about 60 tests) is among them, so it starts within seconds.
Bazel runs each test file as a script of its own and never reads this file; its "exclusive" tag
keeps the same files alone there.
"""

import os
from typing import Set

import pytest

from build_graph import BuildGraph, repo_root

MULTI_PROCESS_GROUP = "multi-process test files"


def exclusive_test_files() -> Set[str]:
  """The repo-relative paths of the test files whose py_test in tests/BUILD is tagged exclusive."""
  graph = BuildGraph(repo_root())
  return {os.path.join(rule.package, src)
          for rule in graph.rules.values()
          if rule.kind == "py_test" and "exclusive" in rule.list_attr("tags")
          for src in rule.list_attr("srcs")}


# Optional: without pytest-xdist (`-p no:xdist`, a Python of one's own) pytest knows no such hook.
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
  """The scheduler of `--dist loadgroup`: the groups above (xdist's own reads xdist_group marks,
  which the absltest classes here do not carry)."""
  if config.getvalue("dist") != "loadgroup":
    return None  # xdist's own choice.
  from xdist.scheduler import LoadFileScheduling  # pylint: disable=import-outside-toplevel

  exclusive = exclusive_test_files()

  class FileOrMultiProcessGroup(LoadFileScheduling):

    def _split_scope(self, nodeid: str) -> str:
      path = nodeid.split("::", 1)[0]
      return MULTI_PROCESS_GROUP if path in exclusive else path

  return FileOrMultiProcessGroup(config, log)
