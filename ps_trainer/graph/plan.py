"""Where a job's variables will live, and what each step moves: the placement plan.

`make` builds the training graph of worker 0 with train_graph.build_graph, the
very function the trainer runs, on a cluster of hosts that need not exist, and
reads the devices the graph was given. Nothing runs and no server starts, so a
plan for 8 PS costs a second on a laptop. `./launch.sh plan` prints it
(plan_main.py).
"""

import collections
from typing import Dict, List

import numpy as np
import tensorflow as tf

from ps_trainer.datasets import data
from ps_trainer.graph import packing
from ps_trainer.graph import placement
from ps_trainer.graph import train_graph
from ps_trainer.settings import config as config_lib

# Each looked-up row also carries its id to the PS and back with its gradient.
_ID_BYTES = 8


def variables_of(graph: tf.Graph) -> List[dict]:
  """Every global variable of `graph`: name, shape, bytes and device."""
  with graph.as_default():
    variables = tf.compat.v1.global_variables()
  return [{"name": v.op.name, "shape": v.shape.as_list(),
           "bytes": placement.variable_bytes(v.op), "device": v.device}
          for v in variables]


def ps_bytes(variables: List[dict], num_ps: int) -> List[int]:
  """Bytes each PS task holds (its variables, parts and optimizer slots)."""
  loads = [0] * num_ps
  for variable in variables:
    spec = tf.DeviceSpec.from_string(variable["device"])
    if spec.job == "ps":
      loads[spec.task or 0] += variable["bytes"]
  return loads


def step_bytes(tg: train_graph.TrainGraph, cfg: config_lib.Config,
               dataset: data.DataSet) -> Dict[str, float]:
  """What one worker moves to and from the PS tasks in one step.

  Whole variables are read once and their gradients sent once (or their
  factors: --factored_gradients), at --wire_dtype, packed and padded: the
  bytes of the packed tensors the graph moves (packing.py). A partitioned
  table moves only the rows the batch looks up, each with its id: at most
  batch_size x ids per example rows (fewer when ids repeat), and no more than
  the table has, float32 either way.
  """
  with tg.graph.as_default():
    trainable = tf.compat.v1.trainable_variables()
    dense_read, dense_gradient = (
        sum(t.shape.num_elements() * t.dtype.size
            for t in tf.compat.v1.get_collection(packs))
        for packs in (packing.READ_PACKS, packing.GRADIENT_PACKS))
  tables = collections.OrderedDict()  # Table name -> (rows, bytes of one row).
  for v in trainable:
    if placement.is_table_part(v):
      info = v._get_save_slice_info()  # pylint: disable=protected-access
      tables[info.full_name] = (info.full_shape[0],
                                int(np.prod(v.shape.as_list()[1:])) * 4)
  ids = dataset.records.mean_ids_per_example if dataset.records else 0.0
  # A batch cannot look up more rows than a table has.
  rows = {name: min(cfg.data.batch_size * ids, table_rows)
          for name, (table_rows, _) in tables.items()}
  sparse = sum(rows[name] * (row_bytes + _ID_BYTES)
               for name, (_, row_bytes) in tables.items())
  detail = {
      "dense_read": dense_read,
      "dense_gradient": dense_gradient,
      "sparse_read": sparse,
      "sparse_gradient": sparse,
      "rows_per_table": max(rows.values(), default=0.0),
  }
  detail["total"] = sum(value for key, value in detail.items()
                        if key != "rows_per_table")
  return detail


def make(cfg: config_lib.Config, dataset: data.DataSet) -> dict:
  """The plan of `cfg`'s job, which must be a worker of a cluster."""
  tg = train_graph.build_graph(cfg, dataset)
  variables = variables_of(tg.graph)
  loads = ps_bytes(variables, cfg.num_ps)
  per_step = step_bytes(tg, cfg, dataset)
  return {
      "num_ps": cfg.num_ps,
      "num_workers": cfg.num_workers,
      "model": cfg.model.model,
      "dataset": cfg.data.dataset,
      "optimizer": cfg.train.optimizer,
      "sync_replicas": cfg.train.sync_replicas,
      "wire_dtype": cfg.train.wire_dtype,
      "factored_gradients": cfg.train.factored_gradients,
      "batch_size": cfg.data.batch_size,
      "variables": variables,
      "ps_bytes": loads,
      "balance": max(loads) / min(loads) if min(loads) > 0 else None,
      "bytes_per_step_per_worker": int(round(per_step["total"])),
      "bytes_per_step_detail": per_step,
  }


def _size(num_bytes: float) -> str:
  for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
    if num_bytes >= scale:
      return f"{num_bytes / scale:.1f} {unit}"
  return f"{num_bytes:.0f} B"


def to_text(plan: dict) -> str:
  """The plan as a table for people."""
  width = max([len(v["name"]) for v in plan["variables"]] + [8])
  options = [f"--model={plan['model']}", f"--dataset={plan['dataset']}",
             f"--optimizer={plan['optimizer']}"]
  if plan["sync_replicas"]:
    options.append("--sync_replicas")
  if plan["wire_dtype"] != "float32":
    options.append(f"--wire_dtype={plan['wire_dtype']}")
  if not plan["factored_gradients"]:
    options.append("--nofactored_gradients")
  lines = [f"Placement plan: {plan['num_ps']} PS, {plan['num_workers']} "
           f"worker(s); {' '.join(options)}", "",
           f"{'variable':<{width}}  {'shape':<16} {'bytes':>10}  device"]
  for v in plan["variables"]:
    lines.append(f"{v['name']:<{width}}  {str(v['shape']):<16} "
                 f"{_size(v['bytes']):>10}  {v['device'] or '(this task)'}")
  total = sum(plan["ps_bytes"]) or 1
  lines += ["", "PS    holds       share"]
  for i, held in enumerate(plan["ps_bytes"]):
    lines.append(f"ps {i:<2} {_size(held):>10}  {held / total:6.1%}")
  if plan["balance"] is not None:
    lines.append(f"largest / smallest PS: {plan['balance']:.2f}x")
  else:
    lines.append("largest / smallest PS: some PS holds nothing (fewer "
                 "variables than PS tasks; lower --num_ps)")
  d = plan["bytes_per_step_detail"]
  # Dense bytes are exact; a table's rows are a bound (repeated ids move once).
  bound = "at most " if d["rows_per_table"] else ""
  lines += ["", f"Each worker moves {bound}{_size(d['total'])} per step: "
            f"dense reads {_size(d['dense_read'])}, dense gradients "
            f"{_size(d['dense_gradient'])}"]
  if d["rows_per_table"]:
    lines[-1] += (f", table rows {_size(d['sparse_read'] + d['sparse_gradient'])}"
                  f" (at most {d['rows_per_table']:.0f} rows per table: "
                  f"batch {plan['batch_size']} x the mean ids per example in "
                  "the data, or the table's rows if fewer; repeated ids move "
                  "once)")
  return "\n".join(lines)
