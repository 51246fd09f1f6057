"""--trace_steps: the time split of a traced step, and the trace files a run writes."""

import json
import os

from absl.testing import absltest
import tensorflow as tf

from ps_trainer.training import tracing
import testutil

WORKER = "/job:worker/replica:0/task:0/device:CPU:0"
PS = "/job:ps/replica:0/task:0/device:CPU:0"


def _step(nodes):
  """StepStats from (device, name, op, start_us, duration_us, output_bytes)."""
  stats = tf.compat.v1.RunMetadata().step_stats
  devices = {}
  for device, name, op, start, duration, out_bytes in nodes:
    if device not in devices:
      devices[device] = stats.dev_stats.add(device=device)
    label = op if op.startswith("[") else f"{name} = {op}(x)"
    node = devices[device].node_stats.add(
        node_name=name, all_start_micros=start, all_end_rel_micros=duration,
        timeline_label=label)
    if out_bytes:
      node.output.add().tensor_description.allocation_description \
          .requested_bytes = out_bytes
  return stats


class SplitStepTest(absltest.TestCase):

  def test_each_instant_counts_once_for_the_first_busy_category(self):
    split = tracing.split_step(_step([
        # 0-1000 us: the PS reads; 1000-3000: the worker waits for 1 MB.
        (PS, "read", "ReadVariableOp", 0, 1000, 0),
        (WORKER, "recv_w", "_Recv", 1000, 2000, 1_000_000),
        # 2000-4000: compute, overlapping the end of the receive.
        (WORKER, "matmul", "MatMul", 2000, 2000, 0),
        # An RPC receive as TF records it: the label rounds 209,715 bytes to
        # "0.2MB" (of 2**20 bytes); its output holds them exactly.
        (WORKER, "RecvTensor", "[0.2MB] [100.0Mb/s] edge_3_w from /job:ps/x to",
         2500, 500, 209_715),
        # 4000-4300: the worker waits for its next batch (the input thread
        # has not drawn it yet), overlapping nothing but the gap; the rest of
        # the gap, 4300-5000, is "other".
        (WORKER, "input/IteratorGetNext", "IteratorGetNext", 4000, 300, 0),
        # 5000-6000: the PS receives the gradient and applies it; the wait for
        # a batch overlapping the apply counts as input.
        (PS, "recv_g", "_Recv", 5000, 500, 400_000),
        (PS, "apply", "ResourceApplyGradientDescent", 5500, 500, 0),
        (WORKER, "IteratorGetNext_1", "IteratorGetNext", 5800, 100, 0),
    ]), wall_ms=7.5)
    self.assertAlmostEqual(split.total_ms, 6.0)
    self.assertAlmostEqual(split.ms["ps"], 1.4)  # 0-1000, 5500-5800, 5900-6000
    self.assertAlmostEqual(split.ms["transfer"], 1.5)  # 1000-2000, 5000-5500
    self.assertAlmostEqual(split.ms["compute"], 2.0)
    self.assertAlmostEqual(split.ms["input"], 0.4)
    self.assertAlmostEqual(split.ms["other"], 0.7)
    self.assertAlmostEqual(split.outside_ms, 1.5)
    self.assertEqual(split.bytes_to_worker, 1_209_715)
    self.assertEqual(split.bytes_to_ps, 400_000)
    self.assertEqual("7.50 ms per traced step: in ops 6.00 (compute 2.00, input 0.40, PS 1.40, "
                     "transfer 1.50, other 0.70), outside them 1.50; 1.21 MB to the worker, "
                     "0.40 MB to the PS", tracing.describe(split))

  def test_mean_of_steps(self):
    one = tracing.split_step(_step([(WORKER, "a", "MatMul", 0, 1000, 0)]), wall_ms=1.5)
    three = tracing.split_step(_step([(WORKER, "a", "MatMul", 0, 3000, 0)]), wall_ms=3.5)
    mean = tracing.mean_split([one, three])
    self.assertAlmostEqual(mean.total_ms, 2.0)
    self.assertAlmostEqual(mean.ms["compute"], 2.0)
    self.assertAlmostEqual(mean.wall_ms, 2.5)
    self.assertAlmostEqual(mean.outside_ms, 0.5)

  def test_a_step_whose_receives_went_unrecorded_does_not_lower_the_bytes(self):
    def step(ps_received):
      return tracing.split_step(_step([
          (WORKER, "a", "MatMul", 0, 1000, 0),
          (PS, "recv_g", "_Recv", 1000, 100, ps_received)]), wall_ms=1.5)
    mean = tracing.mean_split([step(409_664)] * 9 + [step(0)])
    self.assertEqual(mean.bytes_to_ps, 409_664)


class ChromeTraceTest(absltest.TestCase):

  def test_overlapping_ops_get_rows_of_their_own_and_receives_name_their_source(self):
    trace = tracing.chrome_trace([_step([
        (WORKER, "RecvTensor", "[0.8MB] [1.0Gb/s] edge_1_a from /job:ps/replica:0/task:1/"
         "device:CPU:0 to /job:worker/replica:0/task:0/device:CPU:0", 0, 100, 800_000),
        (WORKER, "RecvTensor", "[0.3MB] [1.0Gb/s] edge_2_b from /job:ps/replica:0/task:0/"
         "device:CPU:0 to /job:worker/replica:0/task:0/device:CPU:0", 50, 100, 300_000),
        (WORKER, "matmul", "MatMul", 150, 100, 0),
    ])])
    ops = sorted((e["ts"], e["name"], e["tid"]) for e in trace["traceEvents"] if e["ph"] == "X")
    self.assertEqual(ops, [(0, "RecvTensor from ps 1", 0), (50, "RecvTensor from ps 0", 1),
                           (150, "matmul", 0)])


class TraceHookTest(absltest.TestCase):

  def test_traces_the_asked_steps_after_the_skipped_ones_and_writes_once(self):
    out_dir = os.path.join(testutil.make_tempdir(self), "traces")
    said = []
    graph = tf.Graph()
    with graph.as_default():
      step = tf.compat.v1.train.get_or_create_global_step()
      weights = tf.compat.v1.get_variable("w", initializer=tf.ones([64, 64]))
      # Fetched: Grappler prunes a stateless op that is only a control input.
      product = tf.reduce_sum(tf.linalg.matmul(weights, weights))
      train_op = tf.compat.v1.assign_add(step, 1)
      hook = tracing.TraceHook(3, out_dir, "worker-1", "worker 1",
                               skip_steps=2, echo=said.append)
      with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
        for _ in range(10):
          session.run([train_op, product])
    trace_path = os.path.join(out_dir, "worker-1.json")
    self.assertEqual(hook.written, trace_path)
    with open(trace_path) as f:
      events = json.load(f)["traceEvents"]
    traced = {e["args"]["traced_step"] for e in events if e["ph"] == "X"}
    self.assertEqual(traced, {0, 1, 2})
    self.assertTrue(any("MatMul" in e["args"]["op"] for e in events
                        if e["ph"] == "X"))
    with open(os.path.join(out_dir, "worker-1.split.json")) as f:
      split = json.load(f)
    self.assertEqual(split["steps"], 3)
    self.assertGreater(split["ms"]["compute"], 0)
    # The session.run around the ops takes longer than they do.
    self.assertGreater(split["wall_ms"], split["total_ms"])
    self.assertAlmostEqual(split["outside_ms"], split["wall_ms"] - split["total_ms"])
    self.assertLen(said, 1)
    self.assertStartsWith(said[0], f"worker 1: traced 3 steps into {trace_path}")

  def test_a_run_shorter_than_the_trace_still_writes_what_it_traced(self):
    out_dir = os.path.join(testutil.make_tempdir(self), "traces")
    graph = tf.Graph()
    with graph.as_default():
      step = tf.compat.v1.train.get_or_create_global_step()
      train_op = tf.compat.v1.assign_add(step, 1)
      said = []
      hook = tracing.TraceHook(50, out_dir, "local", "local", skip_steps=0,
                               echo=said.append)
      with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
        for _ in range(4):
          session.run(train_op)
    with open(os.path.join(out_dir, "local.split.json")) as f:
      self.assertEqual(json.load(f)["steps"], 4)
    # Said, not left for the user to count against --trace_steps.
    self.assertLen(said, 1)
    self.assertStartsWith(said[0], "local: traced 4 steps (not 50: the run ended first, and "
                          "its first 0 steps are never traced) into ")


if __name__ == "__main__":
  absltest.main()
