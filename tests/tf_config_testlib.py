"""TF_CONFIG strings for the tests of ps_trainer.settings.cluster, copied from what Kubeflow's TFJob
operator writes (lower-case task types, "environment": "cloud", and its "sparseCluster" form),
and tf_config() for the rest."""

import json

# Kubeflow TFJob "mnist" with 1 PS and 2 workers, as the operator writes it.
_KF_CLUSTER = ('{"ps":["mnist-ps-0.kubeflow.svc:2222"],'
               '"worker":["mnist-worker-0.kubeflow.svc:2222",'
               '"mnist-worker-1.kubeflow.svc:2222"]}')
KF_WORKER_1 = ('{"cluster":' + _KF_CLUSTER + ',"task":{"type":"worker","index":1},'
               '"environment":"cloud"}')
KF_WORKER_0 = ('{"cluster":' + _KF_CLUSTER + ',"task":{"type":"worker","index":0},'
               '"environment":"cloud"}')
KF_PS_0 = ('{"cluster":' + _KF_CLUSTER + ',"task":{"type":"ps","index":0},'
           '"environment":"cloud"}')

# The same job with a chief replica (TFJob replica type Chief).
_KF_CHIEF_CLUSTER = ('{"chief":["mnist-chief-0.kubeflow.svc:2222"],'
                     '"ps":["mnist-ps-0.kubeflow.svc:2222"],'
                     '"worker":["mnist-worker-0.kubeflow.svc:2222"]}')
KF_CHIEF = ('{"cluster":' + _KF_CHIEF_CLUSTER + ',"task":{"type":"chief","index":0},'
            '"environment":"cloud"}')
KF_CHIEF_WORKER_0 = ('{"cluster":' + _KF_CHIEF_CLUSTER +
                     ',"task":{"type":"worker","index":0},"environment":"cloud"}')

# Kubeflow's sparse form (dynamic workers): a worker sees itself and every PS;
# a PS sees only its own address, as a one-entry list.
SPARSE_WORKER_1 = ('{"sparseCluster":{"worker":{"1":"w1:2222"},'
                   '"ps":["ps0:2222","ps1:2222"]},"task":{"type":"worker","index":1}}')
SPARSE_PS_1 = ('{"sparseCluster":{"worker":{},"ps":["ps-1:2222"]},'
               '"task":{"type":"ps","index":1}}')


def tf_config(cluster_dict, task_type="worker", index=0, key="cluster"):
  """A TF_CONFIG string from Python values (for the error cases)."""
  return json.dumps({key: cluster_dict, "task": {"type": task_type, "index": index}})


PS_WORKERS = {"ps": ["ps0:2222"], "worker": ["w0:2222", "w1:2222"]}
