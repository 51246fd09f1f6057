"""The graph of one replica: the model built through its model_fn,
placement, packed reads and gradients, the sync optimizer, the chief's start,
and the placement plan.

Never imports the session loop or fault handling.
"""
