"""Which data sets read files, and what each needs there.

Shared by the flag checks (config.py) and the readers' messages. No numpy:
config imports this before a task blocks its stop signals (stops.py), and
numpy starts its BLAS threads at import, which would then take a SIGTERM and
end the task at once instead of stopping it.
"""

# Base name -> what it holds; the order is the order of read_mnist's result.
MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
MNIST_NEEDS = ("--dataset=mnist needs the four MNIST IDX files (" +
               ", ".join(name + "[.gz]" for name in MNIST_FILES) + ")")

NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
TFRECORD_NEEDS = (
    "--dataset=tfrecord needs --data_dir=DIR holding train* and test* files: "
    "uncompressed TFRecord files of tf.train.Example with features ids (int64 "
    "list), label (int64, 0 or 1) and optional dense (float list, the same "
    "length in every record)")

# Which data sets read --data_dir and --data_path (data.load).
FILE_FLAGS = {"data_dir": ("mnist", "tfrecord"), "data_path": ("npz",)}
# What each of them needs there, for the line that says it is not set.
_FILE_NEEDS = {
    "mnist": f"{MNIST_NEEDS} in --data_dir=DIR",
    "tfrecord": TFRECORD_NEEDS,
    "npz": ("--dataset=npz needs --data_path=FILE.npz with keys "
            f"{', '.join(NPZ_KEYS)}")}


def missing_file_flag(dataset: str, data_dir: str, data_path: str) -> str:
  """The one line for a data set whose file flag is not set; "" when it is,
  or when the data set reads no file."""
  values = {"data_dir": data_dir, "data_path": data_path}
  for flag, reading in FILE_FLAGS.items():
    if dataset in reading and not values[flag]:
      return f"--{flag} is not set; {_FILE_NEEDS[dataset]}"
  return ""
