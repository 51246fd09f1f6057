"""pytest only (Bazel runs each test file as a script): the groups of `./launch.sh test`'s workers.

`./launch.sh test` passes `-n 2 --dist loadgroup`; xdist_groups.py says why and how the files are
grouped. Under loadgroup, xdist_group marks are therefore ignored; other `--dist` modes are
xdist's own.
"""

import pytest

from build_graph import repo_root
import xdist_groups


# Optional: without pytest-xdist (`-p no:xdist`, a Python of one's own) pytest knows no such hook.
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
  if config.getvalue("dist") != "loadgroup":
    return None  # xdist picks its own.
  return xdist_groups.make_scheduler(config, log, repo_root())
