"""The model contract: a user's `model_fn` and `input_fn`, as Estimator had them.

`spec` holds the public names (ModeKeys, ModelSpec) and their checks, with no
TensorFlow import; `loading` turns `--model=PATH.py:FN`, `--input_fn` and
`--params` into callables; `inputs` and `graphs` build a user's functions
into the trainer's graphs (training, evaluation, serving).

Never imports the cluster, placement or session code: a model_fn never sees
the cluster, and the trainer hands this package only features, labels, a mode
and params.
"""
