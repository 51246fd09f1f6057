"""Fault handling: bounds on steps and session starts, hung steps and their
vote, a sync replica's short runs on a PS, a stop request, the other tasks a
replica waits for, and the end of a sync run.

Never imports the session loop, a model or data.
"""
