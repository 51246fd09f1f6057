"""Training: the session loop, its hooks, the evaluator, the export,
checkpoints, result.json, step records and traces.

The top of the library: only the programs (main, task) import it.
"""
