"""The built-in models and data sets on the user's contract.

`networks` builds features into logits; `model_fns` wraps each network in
the contract a user's model keeps (user_model/), and `inputs` makes a
--dataset an input_fn, so the trainer builds a built-in model and data set
exactly as it builds a user's. Never imports the cluster, placement or
session code.
"""

from ps_trainer.models.inputs import input_fn
from ps_trainer.models.model_fns import built_in
from ps_trainer.models.model_fns import params_for
from ps_trainer.models.networks import build_logits
from ps_trainer.models.networks import loss_and_accuracy
from ps_trainer.models.networks import ModelError
from ps_trainer.models.networks import MODELS
from ps_trainer.models.networks import SCOPE

__all__ = ["MODELS", "ModelError", "SCOPE", "build_logits", "built_in",
           "input_fn", "loss_and_accuracy", "params_for"]
