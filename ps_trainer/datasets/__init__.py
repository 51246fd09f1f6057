"""Data: files in, batches out. The built-in data sets, their readers and
checks, and their graph-mode tf.data pipelines.

Never imports the cluster, a model or the model contract.
"""
