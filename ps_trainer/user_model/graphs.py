"""A user's model_fn and input_fn, built into the trainer's graphs.

The trainer calls a model_fn once per graph: TRAIN in the training graph,
EVAL in an evaluation graph of its own, PREDICT in the serving graph. Keras
layers make new variables on a second call in one graph (dense_1 ...), as
Estimator's separate graphs knew; in a fresh graph the names come out the
same, so values move between the graphs by variable name.
"""

import os
import sys
from typing import Callable, Dict, Optional

import tensorflow as tf

from ps_trainer.datasets import data
from ps_trainer.user_model import loading
from ps_trainer.user_model import spec as spec_lib
from ps_trainer.user_model.spec import ModeKeys

# Set, a model_fn's or input_fn's own exception propagates whole.
TRACEBACK_ENV = "PS_TRAINER_TRACEBACK"


def input_context(num_workers: int, index: int) -> tf.distribute.InputContext:
  """Worker `index` of `num_workers` as tf.distribute names input pipelines."""
  return tf.distribute.InputContext(num_input_pipelines=num_workers,
                                    input_pipeline_id=index,
                                    num_replicas_in_sync=num_workers)


def call_model_fn(user: loading.UserModel, features, labels,
                  mode: str) -> spec_lib.ModelSpec:
  """Calls the model_fn in the default graph and checks what it returns.

  Raises:
    ModelFnError: it broke the contract, raised, or used Keras 3.
  """
  available = dict(features=features, labels=labels, mode=mode,
                   params=user.params_dict())
  where = f"--model={user.model_name}"
  graph = tf.compat.v1.get_default_graph()
  before = {op.name for op in graph.get_operations()}
  keras3_before = _keras3_objects()
  result = _guarded(lambda: spec_lib.call_with_named_args(
      user.model_fn, available, loading.MODEL_FN_ARGS, where), where, mode)
  if _keras3_objects() != keras3_before:
    raise spec_lib.ModelFnError(_KERAS3_MESSAGE.format(where=where))
  _check_variables_are_collected(graph, before, where)
  return spec_lib.check(result, mode, where)


_KERAS3_MESSAGE = (
    "{where} uses Keras 3 (`import keras`), which cannot build TF1 graphs "
    "(its layers are named anew in each graph, so no checkpoint fits the "
    "evaluation or the export); use tf.keras (Keras 2 through tf_keras, "
    "selected by TF_USE_LEGACY_KERAS=1, which ps_trainer sets) or "
    "tf.compat.v1.layers")


def _keras3_objects() -> dict:
  """Keras 3's count of the layers (and other objects) it has named so far,
  by kind; {} when Keras 3 is not loaded. A model_fn that changes it built
  Keras 3 layers."""
  state = sys.modules.get("keras.src.backend.common.global_state")
  if state is None:
    return {}
  return dict(state.get_global_attribute("object_name_uids", default={}) or {})


def _check_variables_are_collected(graph: tf.Graph, before: set,
                                   where: str) -> None:
  """Variables the call made outside GLOBAL_VARIABLES (Keras 3 makes them
  so) would never be initialized, placed as variables or saved.

  Raises:
    ModelFnError: naming them, and Keras 3 when it is loaded.
  """
  collected = {v.op.name for v in graph.get_collection(
      tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
  collected |= {v.op.name for v in graph.get_collection(
      tf.compat.v1.GraphKeys.LOCAL_VARIABLES)}
  stray = sorted(op.name for op in graph.get_operations()
                 if op.type in ("VarHandleOp", "VariableV2")
                 and op.name not in before and op.name not in collected)
  if not stray:
    return
  raise spec_lib.ModelFnError(
      f"{where} made variables outside tf.compat.v1's global and local "
      f"collections ({', '.join(stray[:3])}): the trainer can neither "
      "initialize nor save them; make them with tf.compat.v1.get_variable, "
      "tf.compat.v1.layers or tf.keras layers")


def call_input_fn(user: loading.UserModel, mode: str,
                  context: tf.distribute.InputContext) -> tf.data.Dataset:
  """Calls the input_fn in the default graph; its Dataset of (features, labels).

  Raises:
    ModelFnError: no Dataset, elements that are not pairs, or it raised.
  """
  where = user.input_flag
  available = dict(mode=mode, input_context=context, params=user.params_dict())
  dataset = _guarded(lambda: spec_lib.call_with_named_args(
      user.input_fn, available, loading.INPUT_FN_ARGS, where), where, mode)
  if not isinstance(dataset, tf.data.Dataset):
    raise spec_lib.ModelFnError(
        f"{where} returned {type(dataset).__name__} in mode {mode!r}, not a "
        "tf.data.Dataset of (features, labels)")
  element = dataset.element_spec
  if not (isinstance(element, tuple) and len(element) == 2):
    raise spec_lib.ModelFnError(
        f"{where} returned a Dataset of {_describe_element(element)}, not of "
        "(features, labels) pairs; map it to a pair, e.g. "
        "dataset.map(lambda x: (x['image'], x['label']))")
  return dataset


def _describe_element(element) -> str:
  if isinstance(element, tuple):
    return f"{len(element)}-tuples"
  return type(element).__name__


def _guarded(call: Callable, where: str, mode: str):
  """call(), with the user's own exception turned into one ModelFnError."""
  try:
    return call()
  except (spec_lib.ModelFnError, data.DataError):
    raise  # Already one line: a broken contract, or --dataset's own error.
  except Exception as e:  # pylint: disable=broad-except
    if os.environ.get(TRACEBACK_ENV):
      raise
    if _is_keras3(e):
      raise spec_lib.ModelFnError(_KERAS3_MESSAGE.format(where=where)) from None
    raise spec_lib.ModelFnError(
        f"{where} raised in mode {mode!r}: {loading.describe_exception(e)} "
        f"({TRACEBACK_ENV}=1 shows the traceback)") from None


def _is_keras3(error: BaseException) -> bool:
  import traceback  # pylint: disable=g-import-not-at-top
  if "Keras 3" in str(error):
    return True
  frames = traceback.extract_tb(error.__traceback__)
  return any(f"{os.sep}keras{os.sep}src{os.sep}" in frame.filename
             for frame in frames)


def train_input(user: loading.UserModel, num_workers: int,
                index: int) -> data.Input:
  """This worker's endless training input: the TRAIN dataset, started again
  at its end, so --train_steps alone ends the run (also when the workers'
  shards differ in size: none runs dry while the others wait in sync)."""
  dataset = call_input_fn(user, ModeKeys.TRAIN,
                          input_context(num_workers, index)).repeat()
  return data.iterator_input(dataset)


def eval_input(user: loading.UserModel) -> data.Input:
  """One pass over the EVAL dataset; its initializer starts it again.

  Raises:
    ModelFnError: an endless EVAL dataset, whose scoring would never end.
  """
  dataset = call_input_fn(user, ModeKeys.EVAL, input_context(1, 0))
  if _is_endless(dataset):
    raise spec_lib.ModelFnError(
        f"{user.input_flag} returned an endless dataset in mode "
        "'eval' (a repeat() without a count?); the held-out split is scored "
        "in one pass: repeat only in mode 'train', or not at all (the "
        "trainer repeats it)")
  return data.iterator_input(dataset)


def _is_endless(dataset: tf.data.Dataset) -> bool:
  """Whether TF knows `dataset` never ends. Graph mode has no static
  cardinality, so a session of this graph asks it (it reads no element);
  a dataset it cannot ask counts as finite."""
  cardinality = dataset.cardinality()
  try:
    with tf.compat.v1.Session(graph=cardinality.graph) as session:
      value = session.run(cardinality)
  except (tf.errors.OpError, ValueError, TypeError):
    return False
  return int(value) == int(tf.data.INFINITE_CARDINALITY)


def batch_size_of(features) -> tf.Tensor:
  """The examples in a batch: the first dimension of its first feature."""
  first = tf.nest.flatten(features)[0]
  if isinstance(first, tf.SparseTensor):
    return tf.cast(first.dense_shape[0], tf.int64)
  return tf.shape(first, out_type=tf.int64)[0]


def model_variables(graph: tf.Graph) -> Dict[str, tf.Variable]:
  """Name -> variable for what a model keeps: global variables but the
  global step (an evaluation or serving graph holds no optimizer state)."""
  with graph.as_default():
    step = tf.compat.v1.train.get_global_step()
    return {v.op.name: v for v in tf.compat.v1.global_variables()
            if v is not step}


class Evaluation:
  """The model in EVAL mode over the held-out split, in a graph of its own.

  Scores are exact over the split: the loss is averaged per example (each
  batch's mean weighted by its size), and every eval_metric_ops entry is
  accumulated over all batches.
  """

  def __init__(self, user: loading.UserModel,
               make_input: Callable[[], data.Input], custom_getter=None):
    """Builds the graph.

    Args:
      user: the UserModel.
      make_input: builds the held-out input in the default graph.
      custom_getter: the training graph's partitioning, so that names match
        it when values move from the training session (None: whole
        variables, for a graph that restores checkpoints, which assemble
        any partitioning).

    Raises:
      ModelFnError: as call_model_fn.
    """
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.global_step = tf.compat.v1.train.get_or_create_global_step()
      self.input = make_input()
      with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                       custom_getter=custom_getter):
        spec = call_model_fn(user, self.input.features, self.input.labels,
                             ModeKeys.EVAL)
      examples = batch_size_of(self.input.features)
      metrics = {"loss": tf.compat.v1.metrics.mean(
          spec.loss, weights=tf.cast(examples, spec.loss.dtype))}
      metrics.update(spec.eval_metric_ops or {})
      count = tf.compat.v1.get_local_variable(
          "ps_trainer/eval_examples", initializer=tf.constant(0, tf.int64),
          trainable=False)
      count_update = count.assign_add(examples)
      self._values = {name: pair[0] for name, pair in metrics.items()}
      self._count = count
      self._update = tf.group(*[pair[1] for pair in metrics.values()],
                              count_update)
      self._reset = tf.compat.v1.local_variables_initializer()
      self.variables = model_variables(self.graph)
      self._loads = {}  # name -> (placeholder, assign op): values moved in.
      for name, variable in self.variables.items():
        value = tf.compat.v1.placeholder(variable.dtype.base_dtype,
                                         variable.shape)
        self._loads[name] = (value, variable.assign(value, read_value=False))
      self.saver = tf.compat.v1.train.Saver(
          list(self.variables.values()) + [self.global_step], sharded=False)

  def evaluate(self, session) -> dict:
    """Scores the variables `session` holds over the whole split.

    Returns:
      {"loss", "accuracy" (None unless a metric is named so), "examples",
      "metrics": {name: value} with "loss"}.
    """
    session.run(self._reset)
    session.run(self.input.initializer, feed_dict=self.input.feed_dict)
    while True:
      try:
        session.run(self._update)
      except tf.errors.OutOfRangeError:
        break
    values, examples = session.run((self._values, self._count))
    examples = int(examples)
    metrics = {name: _number(value) for name, value in values.items()}
    return {"loss": metrics["loss"], "accuracy": metrics.get("accuracy"),
            "examples": examples, "metrics": metrics}

  def missing_from(self, trained: Dict[str, tf.Variable]) -> list:
    """This graph's variables that the training graph lacks, or holds with
    another shape or dtype: "name [shape] dtype" each."""
    return sorted(
        f"{name} {variable.shape.as_list()} {variable.dtype.base_dtype.name}"
        for name, variable in self.variables.items()
        if name not in trained
        or trained[name].shape.as_list() != variable.shape.as_list()
        or trained[name].dtype.base_dtype != variable.dtype.base_dtype)

  def scorer(self, trained: Dict[str, tf.Variable]) -> Callable:
    """(training session) -> evaluate(): the training graph's values moved
    into this graph by name, then scored here.

    Raises:
      ModelFnError: the EVAL call made variables the TRAIN call did not.
    """
    missing = self.missing_from(trained)
    if missing:
      raise spec_lib.ModelFnError(
          f"the model_fn made variables in mode 'eval' that it did not make "
          f"so in mode 'train' ({', '.join(missing[:3])}); build the same "
          "layers in every mode, on features of the same shape")
    fetches = {name: trained[name] for name in self.variables}

    def score(train_session) -> dict:
      values = train_session.run(fetches)
      with tf.compat.v1.Session(graph=self.graph) as session:
        session.run([assign for _, assign in self._loads.values()],
                    {value: values[name]
                     for name, (value, _) in self._loads.items()})
        return self.evaluate(session)
    return score


def _number(value) -> Optional[float]:
  try:
    return float(value)
  except (TypeError, ValueError):
    return None


# Pads a row of a sparse integer feature served as a dense batch; the
# serving graph drops every negative id.
SPARSE_PADDING = -1


def feature_specs(user: loading.UserModel):
  """The structure of the input_fn's features (EVAL mode), each spec with a
  batch dimension of None: what the serving signature takes."""
  with tf.Graph().as_default():
    element = call_input_fn(user, ModeKeys.EVAL, input_context(1, 0)
                            ).element_spec[0]
  return tf.nest.map_structure(_unbatched, element)


def _unbatched(spec):
  shape = tf.TensorShape([None]).concatenate(spec.shape[1:]) if (
      spec.shape.rank) else tf.TensorShape([None])
  if isinstance(spec, tf.SparseTensorSpec):
    return tf.SparseTensorSpec(shape, spec.dtype)
  return tf.TensorSpec(shape, spec.dtype)


def serving_inputs(specs, name: str = "features") -> tuple:
  """(name -> placeholder, the features as the model reads them).

  A dense feature is a placeholder of its own spec. A sparse integer
  feature is served as a dense batch padded with SPARSE_PADDING, read back
  as a SparseTensor of its non-negative entries (tf.where keeps row-major
  order, as lookups expect). Features that are one tensor are served
  under `name`.

  Raises:
    ModelFnError: a sparse feature of another dtype.
  """
  named = (specs if isinstance(specs, dict) else {name: specs})
  inputs, features = {}, {}
  for key, spec in named.items():
    if isinstance(spec, tf.SparseTensorSpec):
      if not spec.dtype.is_integer:
        raise spec_lib.ModelFnError(
            f"the sparse feature {key!r} is {spec.dtype.name}; only integer "
            "sparse features (ids) can be served")
      dense = tf.compat.v1.placeholder(spec.dtype, [None, None], name=key)
      present = tf.where(tf.greater_equal(dense, 0))
      features[key] = tf.SparseTensor(
          present, tf.gather_nd(dense, present),
          tf.shape(dense, out_type=tf.int64))
      inputs[key] = dense
    else:
      inputs[key] = features[key] = tf.compat.v1.placeholder(
          spec.dtype, spec.shape, name=key)
  return inputs, (features if isinstance(specs, dict) else features[name])


def serving_outputs(user: loading.UserModel, features) -> dict:
  """The model's PREDICT-mode predictions, by name ("predictions" for one
  tensor)."""
  spec = call_model_fn(user, features, None, ModeKeys.PREDICT)
  if isinstance(spec.predictions, dict):
    return dict(spec.predictions)
  return {"predictions": spec.predictions}
