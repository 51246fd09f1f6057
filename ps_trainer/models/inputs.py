"""The built-in data sets (--dataset) as input_fns on the user's contract.

The trainer reads a built-in data set exactly as it reads a user's input_fn:
through the contract's calls (user_model/graphs.py), one shard per worker.
"""

from ps_trainer.datasets import data
from ps_trainer.user_model.spec import ModeKeys

# Batches of the test split when it is scored.
TEST_BATCH_SIZE = 1000


def input_fn(ds: data.DataSet, batch_size: int, seed: int):
  """--dataset as an input_fn: in mode "train" this worker's endless shard
  (data.train_dataset), else the test split in batches of TEST_BATCH_SIZE.
  The function raises DataError as they do."""
  def dataset_input_fn(mode, input_context):
    if mode == ModeKeys.TRAIN:
      return data.train_dataset(ds, batch_size,
                                input_context.num_input_pipelines,
                                input_context.input_pipeline_id, seed)
    return data.test_dataset(ds, TEST_BATCH_SIZE)
  return dataset_input_fn
