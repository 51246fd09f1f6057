"""Measuring ps_trainer as users run it: the bench, the sync/async comparison,
and the plain TF1 baseline they are measured against. Nothing here is imported
by the trainer."""
