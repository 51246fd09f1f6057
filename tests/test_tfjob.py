"""deploy/kubernetes/tfjob.yaml: what the manifest promises, then the job it describes, run here.

The Kubeflow operator starts each replica with the manifest's command and args and a TF_CONFIG of
its own: the cluster of chief, PS and workers at <job>-<type>-<index>.<namespace>.svc:<port>
(the evaluator is not part of it), the replica's task, and "environment": "cloud". The run test
writes exactly that for every replica, with the addresses rewritten to free localhost ports and
the shared volume's mount path to a temp dir, and runs the whole job to completion.
"""

import json
import os
import re

from absl.testing import absltest
import yaml

from ps_trainer.faults import stops
import testutil

MANIFEST = os.path.join(testutil.REPO_ROOT, "deploy", "kubernetes", "tfjob.yaml")
DOCKERFILE = os.path.join(testutil.REPO_ROOT, "deploy", "kubernetes", "Dockerfile")
DOCKERIGNORE = os.path.join(testutil.REPO_ROOT, ".dockerignore")
REPLICA_TYPES = ("Chief", "PS", "Worker", "Evaluator")
TIMEOUT_SECS = 300
_CLUSTER_FLAGS = re.compile(r"^--(ps_hosts|worker_hosts|job_name|task_index)=")


def _load():
  with open(MANIFEST, encoding="utf-8") as f:
    docs = list(yaml.safe_load_all(f))
  tfjobs = [d for d in docs if d.get("kind") == "TFJob"]
  claims = {d["metadata"]["name"] for d in docs
            if d.get("kind") == "PersistentVolumeClaim"}
  assert len(tfjobs) == 1, f"{MANIFEST} holds {len(tfjobs)} TFJobs"
  return tfjobs[0], claims


def _container(spec):
  return spec["template"]["spec"]["containers"][0]


def operator_tf_configs(tfjob, namespace="default"):
  """{(type, index): TF_CONFIG dict} as the training operator writes them."""
  name = tfjob["metadata"]["name"]
  specs = tfjob["spec"]["tfReplicaSpecs"]
  cluster = {}
  for rtype, spec in specs.items():
    if rtype == "Evaluator":
      continue  # Not part of the training cluster.
    port = next(p["containerPort"] for p in _container(spec)["ports"]
                if p["name"] == "tfjob-port")
    kind = rtype.lower()
    cluster[kind] = [f"{name}-{kind}-{i}.{namespace}.svc:{port}"
                     for i in range(spec["replicas"])]
  return {(rtype.lower(), i): {"cluster": cluster,
                               "task": {"type": rtype.lower(), "index": i},
                               "environment": "cloud"}
          for rtype, spec in specs.items() for i in range(spec["replicas"])}


class ImageTest(absltest.TestCase):

  def test_the_build_context_is_what_the_dockerfile_copies(self):
    """The README's `docker build ... .` would otherwise send .venv, data/ and runs/."""
    with open(DOCKERFILE, encoding="utf-8") as f:
      # COPY [--option ...] SOURCE DEST
      copied = {[w for w in line.split()[1:] if not w.startswith("--")][0]
                for line in f if line.startswith("COPY ")}
    with open(DOCKERIGNORE, encoding="utf-8") as f:
      rules = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    self.assertEqual(rules[0], "*")  # Everything out, then each copied path back in.
    self.assertEqual({rule[1:] for rule in rules if rule.startswith("!")}, copied)


class ManifestTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tfjob, self.claims = _load()
    self.specs = self.tfjob["spec"]["tfReplicaSpecs"]

  def test_a_kubeflow_v1_tfjob_with_every_role(self):
    self.assertEqual(self.tfjob["apiVersion"], "kubeflow.org/v1")
    self.assertEqual(sorted(self.specs), sorted(REPLICA_TYPES))
    self.assertEqual(self.specs["Chief"]["replicas"], 1)
    self.assertGreaterEqual(self.specs["PS"]["replicas"], 1)
    self.assertGreaterEqual(self.specs["Worker"]["replicas"], 1)

  def test_each_replica_runs_the_trainer_with_training_flags_only(self):
    args = {}
    for rtype, spec in self.specs.items():
      container = _container(spec)
      self.assertEqual(container["name"], "tensorflow", rtype)
      self.assertEqual(container["command"], ["python", "-m", "ps_trainer"], rtype)
      self.assertIn({"containerPort": 2222, "name": "tfjob-port"}, container["ports"], rtype)
      self.assertTrue(container["resources"]["requests"]["cpu"], rtype)
      self.assertTrue(container["resources"]["requests"]["memory"], rtype)
      for arg in container["args"]:
        self.assertNotRegex(arg, _CLUSTER_FLAGS, f"{rtype}: TF_CONFIG carries the cluster")
      args[rtype] = container["args"]
    # Every task must start with the same training flags (run_signature.py checks it).
    self.assertLen({tuple(a) for a in args.values()}, 1, args)

  def test_log_dir_is_on_the_shared_volume(self):
    for rtype, spec in self.specs.items():
      container = _container(spec)
      log_dir = next(a.split("=", 1)[1] for a in container["args"]
                     if a.startswith("--log_dir="))
      volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
      mounts = [m for m in container["volumeMounts"]
                if log_dir.startswith(m["mountPath"].rstrip("/") + "/")]
      self.assertLen(mounts, 1, f"{rtype}: --log_dir={log_dir} is on no mounted volume")
      claim = volumes[mounts[0]["name"]]["persistentVolumeClaim"]["claimName"]
      self.assertIn(claim, self.claims, rtype)

  def test_a_stopped_ps_is_killed_only_after_it_served_the_chiefs_last_checkpoint(self):
    # Kubernetes' default of 30 s would kill a PS while a blocked chief writes it (stops.py).
    for rtype, spec in self.specs.items():
      self.assertGreater(spec["template"]["spec"]["terminationGracePeriodSeconds"],
                         stops.PS_GRACE_SECS + 2, rtype)

  def test_restarts_only_what_a_restart_can_fix(self):
    # Exit 1 (a peer stayed away, NaN) and 2 (bad input) are permanent; killed replicas
    # (128 + signal) come back and rejoin.
    for rtype, spec in self.specs.items():
      self.assertEqual(spec["restartPolicy"], "ExitCode", rtype)

  def test_operator_tf_config_leaves_the_evaluator_out_of_the_cluster(self):
    configs = operator_tf_configs(self.tfjob, "team")
    chief = configs[("chief", 0)]
    self.assertEqual(chief["cluster"]["chief"], ["ps-trainer-chief-0.team.svc:2222"])
    self.assertNotIn("evaluator", chief["cluster"])
    self.assertEqual(configs[("evaluator", 0)]["task"], {"type": "evaluator", "index": 0})


class ManifestRunTest(absltest.TestCase):

  def test_the_replicas_train_to_completion_with_the_operators_tf_config(self):
    tfjob, _ = _load()
    run_dir = testutil.make_tempdir(self)
    configs = operator_tf_configs(tfjob)
    addresses = sorted({a for c in configs.values() for job in c["cluster"].values()
                        for a in job})
    local = dict(zip(addresses, (f"127.0.0.1:{p}" for p in
                                 testutil.pick_free_ports(len(addresses)))))
    procs = {}
    for (kind, index), tf_config in configs.items():
      spec = tfjob["spec"]["tfReplicaSpecs"][
          {"chief": "Chief", "ps": "PS", "worker": "Worker", "evaluator": "Evaluator"}[kind]]
      container = _container(spec)
      mount = container["volumeMounts"][0]["mountPath"].rstrip("/")
      args = [a.replace(f"={mount}/", f"={run_dir}/") for a in container["args"]]
      tf_config = json.loads(json.dumps(tf_config))
      tf_config["cluster"] = {job: [local[a] for a in hosts]
                              for job, hosts in tf_config["cluster"].items()}
      name = f"{kind}-{index}"
      proc = testutil.start(
          [testutil.PYTHON] + container["command"][1:] + args,
          os.path.join(run_dir, "logs", f"{name}.log"),
          env=testutil.trainer_env({"TF_CONFIG": json.dumps(tf_config)}), name=name)
      self.addCleanup(proc.kill_group)
      procs[name] = proc
    for name, proc in procs.items():
      self.assertEqual(proc.wait(timeout=TIMEOUT_SECS), 0, f"{name} failed\n{proc.log_tail()}")

    chief = _container(tfjob["spec"]["tfReplicaSpecs"]["Chief"])
    flags = dict(a[2:].split("=", 1) for a in chief["args"])
    mount = chief["volumeMounts"][0]["mountPath"].rstrip("/")
    log_dir = flags["log_dir"].replace(mount, run_dir, 1)
    train_steps = int(flags["train_steps"])
    result = testutil.read_result_json(log_dir)
    self.assertGreaterEqual(result["global_step"], train_steps)
    self.assertEqual((result["num_workers"], result["num_ps"]), (3, 1))
    with open(os.path.join(log_dir, "eval.json"), encoding="utf-8") as f:
      scores = json.load(f)
    # The evaluator scored the chief's final checkpoint. result.json scores the model the PS
    # holds at the end, which in async mode may include a straggling worker's last update
    # (docs/reference.md: result.json): nearly the same model, not always the same step.
    self.assertGreaterEqual(scores[-1]["global_step"], train_steps)
    self.assertLessEqual(scores[-1]["global_step"], result["global_step"])
    self.assertAlmostEqual(scores[-1]["accuracy"], result["accuracy"], delta=0.02)
    self.assertTrue(os.path.isdir(result["export_dir"]), result)
    self.assertIn("chief:", procs["chief-0"].read_log())
    self.assertIn("worker 0:", procs["worker-0"].read_log())
    self.assertIn("evaluator: scored the final checkpoint", procs["evaluator-0"].read_log())
    # Only the chief writes into --log_dir; no task made a directory of its own there.
    self.assertFalse(os.path.exists(os.path.join(log_dir, "worker-0")))
    testutil.assert_no_leftover(marker=run_dir)


if __name__ == "__main__":
  absltest.main()
