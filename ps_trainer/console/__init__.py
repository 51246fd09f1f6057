"""Process and console plumbing: one-line errors, quiet imports, help, output
directories, a program's start and end.

The lowest layer: imports nothing else of ps_trainer.
"""
