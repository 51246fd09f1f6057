"""The run signature: which flag differences between tasks are refused, and how."""

import dataclasses

from absl.testing import absltest

from ps_trainer.settings import run_signature

import testutil


class RunSignatureTest(absltest.TestCase):

  def signature(self, *argv):
    cfg = testutil.make_config(
        "--ps_hosts=127.0.0.1:1", "--worker_hosts=127.0.0.1:2,127.0.0.1:3",
        "--job_name=worker", "--task_index=1", *argv)
    return run_signature.of(cfg, (8, 8, 1), 10)

  def test_same_flags_match(self):
    own = self.signature("--sync_replicas")
    self.assertIsNone(run_signature.mismatch(
        own, run_signature.encode(self.signature("--sync_replicas"))))

  def test_a_seed_of_its_own_may_differ(self):
    # It orders the worker's own examples; the model's first values are the chief's.
    self.assertIsNone(run_signature.mismatch(
        self.signature("--seed=3"), run_signature.encode(self.signature())))

  def test_its_own_batch_size_or_learning_rate_is_refused(self):
    # result.json would count the chief's batch for every step, and sync
    # would average unequal batches as equals.
    message = run_signature.mismatch(self.signature("--batch_size=32", "--learning_rate=0.5"),
                                     run_signature.encode(self.signature()))
    self.assertIn("batch_size: 32 here but 64 on the chief", message)
    self.assertIn("learning_rate: 0.5 here but 0.001 on the chief", message)

  def test_each_difference_is_named_on_one_line(self):
    chief = run_signature.encode(self.signature("--sync_replicas"))
    own = self.signature("--optimizer=sgd", "--hidden_units=32")
    message = run_signature.mismatch(own, chief)
    self.assertNotIn("\n", message)
    self.assertRegex(message, r"^this worker's settings differ from the "
                     r"chief's: hidden_units: 32 here but 128,64 on the "
                     r"chief; learning_rate: 0.1 here but 0.001 on the chief; "
                     r"optimizer: sgd here but adam on the chief; "
                     r"replicas_to_aggregate: not used here but 2 on the chief; "
                     r"sync_replicas: False here but True on the chief; start "
                     r"every task with the same training flags$")

  def test_a_setting_another_model_does_not_use_reads_as_such(self):
    chief = run_signature.encode(self.signature("--hidden_units=128,64"))
    message = run_signature.mismatch(self.signature("--model=linear"), chief)
    self.assertIn("hidden_units: not used here but 128,64 on the chief", message)
    self.assertIn("model: linear here but mlp on the chief", message)

  def test_a_model_added_later_has_its_hidden_units_checked(self):
    cfg = testutil.make_config("--hidden_units=32")
    mine = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, model="my_model"))
    self.assertEqual(run_signature.of(mine, (8, 8, 1), 10)["hidden_units"], [32])
    for model in ("linear", "cnn"):
      self.assertIsNone(self.signature(f"--model={model}")["hidden_units"], model)

  def test_a_setting_the_chiefs_version_did_not_publish_is_named_as_such(self):
    own = self.signature()
    chief = dict(own)
    del chief["num_ps"]
    self.assertIn("num_ps: 1 here but not known (another version of ps_trainer?) on the chief",
                  run_signature.mismatch(own, run_signature.encode(chief)))

  def test_unreadable_signature(self):
    self.assertIn("unreadable", run_signature.mismatch(self.signature(), "{"))


  def test_other_host_lists_are_refused(self):
    cfg = testutil.make_config(
        "--ps_hosts=127.0.0.1:1", "--worker_hosts=127.0.0.1:2,127.0.0.1:4",
        "--job_name=worker", "--task_index=1")
    message = run_signature.mismatch(run_signature.of(cfg, (8, 8, 1), 10),
                                     run_signature.encode(self.signature()))
    self.assertIn("hosts: ps: 127.0.0.1:1; worker: 127.0.0.1:2,127.0.0.1:4 here but ps: "
                  "127.0.0.1:1; worker: 127.0.0.1:2,127.0.0.1:3 on the chief", message)

  def test_a_users_model_with_other_variables_or_params_is_refused(self):
    class Variable:  # What of() reads of a variable.
      def __init__(self, name, shape):
        self.op = type("Op", (), {"name": name})()
        self.shape = type("Shape", (), {"as_list": lambda _: shape})()
        self.dtype = type("DType", (), {"base_dtype": type("D", (), {"name": "float32"})()})()
    cfg = testutil.make_config("--ps_hosts=127.0.0.1:1", "--worker_hosts=127.0.0.1:2",
                               "--job_name=worker", "--task_index=0", "--log_dir=/tmp/x",
                               "--model=my_model:model_fn", '--params={"units": 8}')
    chief = run_signature.of(cfg, (), 0, variables=[Variable("dense/kernel", [6, 8])])
    other = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, params='{"units": 16}'))
    own = run_signature.of(other, (), 0, variables=[Variable("dense/kernel", [6, 16])])
    message = run_signature.mismatch(own, run_signature.encode(chief))
    self.assertIn("model variables: dense/kernel [6, 16] float32 here but dense/kernel [6, 8] "
                  "float32 on the chief", message)
    self.assertIn('params: {"units": 16} here but {"units": 8} on the chief', message)

if __name__ == "__main__":
  absltest.main()
