"""The cluster's servers and the PS lifecycle: a task's server, the PS task,
the flags the PS tasks hold, bounded waits for peers, runs TF turns away as
repeats, and the cores a task keeps to.

Never imports a model, data, the graph or the session loop.
"""
