"""A worker started again after its run finished: the chief exports what it had not and ends, PS
or none; another worker that sees the chief's log dir ends at once.

A chief killed during its export leaves its checkpoints and result.json, an export that is gone or
half-written, and a result.json that names no export; the job's PS tasks have exited. Here that
state is made by hand from a finished run.
"""

import contextlib
import io
import json
import os
import shutil
import socket
import tempfile

from absl.testing import absltest
import tensorflow as tf

from ps_trainer.cluster import waits
from ps_trainer.datasets import data
from ps_trainer.training import export
from ps_trainer.training import finished_run
from ps_trainer.training import trainer

import testutil

tf.compat.v1.disable_eager_execution()

TRAIN_STEPS = 60
_RUN_FLAGS = ("--model=linear", f"--train_steps={TRAIN_STEPS}", "--log_every_steps=1000")


class _Stop:
  """A requested stop, as stops.StopRequest reports one."""
  who = "chief"
  requested = True
  signal_name = "SIGTERM"


def _as_if_killed_during_export(log_dir: str) -> None:
  """Removes the export of a finished run, leaves half of one, and drops it from result.json."""
  shutil.rmtree(os.path.join(log_dir, export.EXPORT_SUBDIR), ignore_errors=True)
  partial = os.path.join(log_dir, export.EXPORT_SUBDIR, f".partial-{TRAIN_STEPS}-12345")
  os.makedirs(partial)
  with open(os.path.join(partial, "saved_model.pb"), "w") as f:
    f.write("half of it")
  path = os.path.join(log_dir, "result.json")
  with open(path) as f:
    result = json.load(f)
  result.pop("export_dir", None)
  with open(path, "w") as f:
    json.dump(result, f)


def _chief_flags(log_dir: str, num_ps: int = 1, wait_timeout_secs: int = 1,
                 ps_ports=None) -> list:
  """Worker 0's flags in a cluster of `num_ps` PS and 1 worker on 127.0.0.1."""
  ports = testutil.pick_free_ports(num_ps + 1)
  ps_ports = ps_ports or ports[:num_ps]
  return [f"--ps_hosts={','.join(f'127.0.0.1:{p}' for p in ps_ports)}",
          f"--worker_hosts=127.0.0.1:{ports[-1]}", "--job_name=worker", "--task_index=0",
          f"--log_dir={log_dir}", f"--wait_timeout_secs={wait_timeout_secs}", *_RUN_FLAGS]


def _listening_sockets(test, n: int) -> list:
  """n ports something accepts connections on, as a PS's would."""
  ports = []
  for _ in range(n):
    listener = socket.socket()
    test.addCleanup(listener.close)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    ports.append(listener.getsockname()[1])
  return ports


class InProcessTest(absltest.TestCase):
  """Against a local run's log dir, made once: its files are a finished chief's."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls._finished = tempfile.mkdtemp(prefix="ps_trainer_test_", dir=os.environ.get("TEST_TMPDIR"))
    cls.addClassCleanup(shutil.rmtree, cls._finished, ignore_errors=True)
    cfg = testutil.make_config(f"--log_dir={cls._finished}", *_RUN_FLAGS)
    with contextlib.redirect_stdout(io.StringIO()):
      trainer.train(cfg, data.load("digits"))  # result.json and checkpoints; no export.

  def _log_dir(self) -> str:
    log_dir = os.path.join(testutil.make_tempdir(self), "run")
    shutil.copytree(self._finished, log_dir)
    _as_if_killed_during_export(log_dir)
    return log_dir

  def test_finished_means_result_json_and_the_newest_checkpoint_reached_train_steps(self):
    log_dir = self._log_dir()
    result = finished_run.earlier_result(log_dir, TRAIN_STEPS)
    self.assertEqual(result["global_step"], TRAIN_STEPS)
    self.assertIsNotNone(finished_run.earlier_result(log_dir, TRAIN_STEPS - 1))
    # Started again with a higher --train_steps: it trains on.
    self.assertIsNone(finished_run.earlier_result(log_dir, TRAIN_STEPS + 1))
    # Its checkpoints removed to start over: it trains again.
    for name in os.listdir(log_dir):
      if name.startswith("model.ckpt-") or name == "checkpoint":
        os.remove(os.path.join(log_dir, name))
    self.assertIsNone(finished_run.earlier_result(log_dir, TRAIN_STEPS))

  def test_a_missing_or_unreadable_result_json_is_not_a_finished_run(self):
    log_dir = self._log_dir()
    for text in (None, "{not json", "[1, 2]", '{"accuracy": 0.9}', '{"global_step": "many"}'):
      path = os.path.join(log_dir, "result.json")
      if text is None:
        os.remove(path)
      else:
        with open(path, "w") as f:
          f.write(text)
      self.assertIsNone(finished_run.earlier_result(log_dir, TRAIN_STEPS), text)

  def test_the_cluster_counts_as_restarted_only_when_every_ps_answers(self):
    log_dir = self._log_dir()
    cases = (("none", []), ("one of two", _listening_sockets(self, 1)),
             ("both", _listening_sockets(self, 2)))
    for name, listening in cases:
      ps_ports = listening + testutil.pick_free_ports(2 - len(listening))
      cfg = testutil.make_config(*_chief_flags(log_dir, num_ps=2, ps_ports=ps_ports))
      output = io.StringIO()
      with contextlib.redirect_stdout(output):
        restarted = finished_run.cluster_restarted(cfg, stop=None)
      self.assertEqual(restarted, name == "both", f"{name}: {output.getvalue()}")
      self.assertEqual("only ps 0 answered" in output.getvalue(), name == "one of two",
                       f"{name}: {output.getvalue()}")
    with self.assertRaisesRegex(waits.Stopped, "^stopped on SIGTERM while waiting for ps 0"):
      finished_run.cluster_restarted(
          testutil.make_config(*_chief_flags(log_dir, wait_timeout_secs=30)), stop=_Stop())

  def test_alone_it_exports_the_final_checkpoint_and_names_it_in_result_json(self):
    log_dir = self._log_dir()
    cfg = testutil.make_config(*_chief_flags(log_dir))
    result = finished_run.earlier_result(log_dir, TRAIN_STEPS)
    with self.assertRaisesRegex(waits.Stopped, "before exporting"):
      finished_run.export_alone(cfg, data.load("digits"), result, stop=_Stop())
    self.assertNotIn(str(TRAIN_STEPS), os.listdir(os.path.join(log_dir, "export")))
    for attempt in ("first", "again"):
      output = io.StringIO()
      with contextlib.redirect_stdout(output):
        finished_run.export_alone(cfg, data.load("digits"),
                                  finished_run.earlier_result(log_dir, TRAIN_STEPS), stop=None)
      path = os.path.join(log_dir, "export", str(TRAIN_STEPS))
      self.assertTrue(os.path.exists(os.path.join(path, "saved_model.pb")), output.getvalue())
      self.assertEqual(os.listdir(os.path.dirname(path)), [str(TRAIN_STEPS)])  # Partial gone.
      self.assertEqual(testutil.read_result_json(log_dir),
                       dict(result, export_dir=os.path.abspath(path)))
      self.assertEqual("kept from an earlier export" in output.getvalue(), attempt == "again",
                       output.getvalue())
      self.assertEndsWith(output.getvalue(),
                          f"chief: the run had finished at global step {TRAIN_STEPS} and its PS "
                          "tasks have left: the job is over\n")


class ChiefStartedAgainTest(absltest.TestCase):
  """The real binary: a 1 PS + 1 worker run, then its chief started again, alone and with a PS,
  and a second worker started alone."""

  def _start(self, name: str, argv: list, log_dir: str) -> testutil.Process:
    proc = testutil.start([testutil.PYTHON, "-m", "ps_trainer", *argv],
                          os.path.join(log_dir, "logs", f"{name}.log"), name=name)
    self.addCleanup(proc.kill_group)
    return proc

  def _run_ps_and_chief(self, hosts: list, log_dir: str, phase: str) -> str:
    """Starts the PS and the chief together; both must exit 0. Returns the chief's log."""
    ps = self._start(f"ps-{phase}", [*hosts, "--job_name=ps", "--task_index=0"], log_dir)
    chief = self._start(f"chief-{phase}", [*hosts, "--job_name=worker", "--task_index=0"],
                        log_dir)
    self.assertEqual(chief.wait(120), 0, f"{phase}: {chief.log_tail()}\n{ps.log_tail()}")
    self.assertEqual(ps.wait(60), 0, f"{phase}: {ps.log_tail()}")
    return chief.read_log()

  def test_alone_it_exports_and_exits_0_and_with_its_ps_it_ends_the_run_as_before(self):
    log_dir = testutil.make_tempdir(self)
    ps_port, worker_port, second_worker_port = testutil.pick_free_ports(3)
    hosts = [f"--ps_hosts=127.0.0.1:{ps_port}", f"--worker_hosts=127.0.0.1:{worker_port}",
             f"--log_dir={log_dir}", *_RUN_FLAGS]
    self._run_ps_and_chief([*hosts, "--wait_timeout_secs=60"], log_dir, "run")
    export_dir = os.path.join(log_dir, "export", str(TRAIN_STEPS))
    self.assertEqual(testutil.read_result_json(log_dir)["export_dir"], export_dir)

    # Killed during its export, then started again alone: the PS has left.
    _as_if_killed_during_export(log_dir)
    chief = self._start("chief-alone", [*hosts, "--wait_timeout_secs=2", "--job_name=worker",
                                        "--task_index=0"], log_dir)
    self.assertEqual(chief.wait(120), 0, chief.log_tail())
    self.assertIn("the job is over", chief.read_log())
    self.assertEqual(testutil.read_result_json(log_dir)["export_dir"], export_dir)
    self.assertEqual(os.listdir(os.path.dirname(export_dir)), [str(TRAIN_STEPS)])

    # Another worker of the finished job started again, seeing its --log_dir: nothing to train.
    second_worker = [f"--ps_hosts=127.0.0.1:{ps_port}",
                     f"--worker_hosts=127.0.0.1:{worker_port},127.0.0.1:{second_worker_port}",
                     f"--log_dir={log_dir}", *_RUN_FLAGS, "--wait_timeout_secs=2",
                     "--job_name=worker", "--task_index=1"]
    worker = self._start("worker-1-alone", second_worker, log_dir)
    self.assertEqual(worker.wait(120), 0, worker.log_tail())
    self.assertIn(f"worker 1: the run in {log_dir} had finished at global step {TRAIN_STEPS} "
                  "and its PS tasks have left: the job is over", worker.read_log())
    self.assertEqual(testutil.read_result_json(log_dir)["export_dir"], export_dir)

    # Killed during its export, then the whole cluster started again: it ends in a session.
    _as_if_killed_during_export(log_dir)
    log = self._run_ps_and_chief([*hosts, "--wait_timeout_secs=60"], log_dir, "restarted")
    self.assertIn("nothing to train", log)
    self.assertNotIn("the job is over", log)
    self.assertEqual(testutil.read_result_json(log_dir)["export_dir"], export_dir)
    self.assertEqual(os.listdir(os.path.dirname(export_dir)), [str(TRAIN_STEPS)])


if __name__ == "__main__":
  absltest.main()
