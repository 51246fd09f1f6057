"""Flags and TF_CONFIG in, a frozen Config out: the flags, the cluster as one
task sees it (host lists, TF_CONFIG), the run's configuration and signature.

Never imports TensorFlow's servers, the graph, training or fault handling.
"""
