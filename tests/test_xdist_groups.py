"""The groups `./launch.sh test` runs on its two workers: no two multi-process files at once."""

import collections
import importlib.util
import os
import re
import subprocess
import sys

from absl.testing import absltest

from build_graph import repo_root
import testutil
import xdist_groups

# Test files that start several TensorFlow processes (faults, launch.sh clusters, bench).
MULTI_PROCESS_FILES = ("tests/test_faults.py", "tests/test_sync_faults.py",
                       "tests/test_launch_local.py", "tests/test_experiments.py",
                       "tests/test_hosts_netns.py")


class XdistGroupsTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.exclusive = xdist_groups.exclusive_test_files(repo_root())

  def test_every_large_test_file_is_in_the_one_multi_process_group(self):
    large = xdist_groups.py_test_files(repo_root(), lambda rule: rule.attrs.get("size") == "large")
    self.assertTrue(set(MULTI_PROCESS_FILES) <= large, large)
    for path in large:
      self.assertEqual(xdist_groups.group_of(f"{path}::SomeTest::test_x", self.exclusive),
                       xdist_groups.MULTI_PROCESS_GROUP,
                       f"{path} is a large (multi-process) test: tag it exclusive in tests/BUILD")

  def test_any_other_file_is_a_group_of_its_own(self):
    groups = {xdist_groups.group_of(nodeid, self.exclusive)
              for nodeid in ("tests/test_config.py::FlagDefaultsTest::test_a",
                             "tests/test_config.py::OtherTest::test_b",
                             "tests/test_flags.py::test_c",
                             "tests/test_faults.py::FaultsTest::test_d")}
    self.assertEqual(groups, {"tests/test_config.py", "tests/test_flags.py",
                              xdist_groups.MULTI_PROCESS_GROUP})

  def test_two_multi_process_files_run_on_one_worker_and_another_file_on_the_other(self):
    """pytest on two workers as `./launch.sh test` runs it, on quick tests of two multi-process
    files and one other file, handed out in that order (--no-loadscope-reorder): xdist's own file
    groups would send the two multi-process files to the two workers."""
    if importlib.util.find_spec("xdist") is None:
      self.skipTest("pytest-xdist is not installed (`./launch.sh test` installs it)")
    root = repo_root()
    # pytest.ini's path settings, made absolute: under Bazel the repo is a runfiles tree without
    # pytest.ini, where pytest would look for a root of its own.
    ini = os.path.join(testutil.make_tempdir(self), "pytest.ini")
    with open(ini, "w", encoding="utf-8") as f:
      f.write(f"[pytest]\npythonpath = {root} {os.path.join(root, 'tests')}\n")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", ini, f"--rootdir={root}", "-n", "2",
         "--dist", "loadgroup", "--no-loadscope-reorder", "-v", "-p", "no:cacheprovider",
         "tests/test_tfjob.py::ManifestTest", "tests/test_experiments.py::TrainerArgsTest",
         "tests/test_config.py"],
        cwd=root, capture_output=True, text=True, timeout=90, check=False)
    self.assertEqual(run.returncode, 0, run.stdout[-3000:] + run.stderr[-3000:])
    workers = collections.defaultdict(set)
    for worker, path in re.findall(r"^\[(gw\d+)\].* PASSED (tests/[\w.]+)::", run.stdout, re.M):
      workers[path].add(worker)
    self.assertEqual(set(workers), {"tests/test_tfjob.py", "tests/test_experiments.py",
                                    "tests/test_config.py"}, run.stdout[-3000:])
    self.assertEqual(len(workers["tests/test_tfjob.py"]), 1, workers)
    self.assertEqual(workers["tests/test_tfjob.py"], workers["tests/test_experiments.py"])
    self.assertEqual(len(workers["tests/test_config.py"]), 1, workers)
    self.assertNotEqual(workers["tests/test_config.py"], workers["tests/test_tfjob.py"])


if __name__ == "__main__":
  absltest.main()
