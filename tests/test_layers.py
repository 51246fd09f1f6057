"""The package's layers: no import runs back up.

Reads every module of ps_trainer/ (as text, with ast: nothing is imported) and
fails, naming the file and the import, when a module imports a sub-package
above its own in LAYERS. Deferred imports inside functions count too.
"""

import ast
import os

from absl.testing import absltest

import testutil

# Lowest first. A module may import its own layer and those below it. The top
# level (the programs and the public face) and experiments/ may import all.
LAYERS = (
    "console",     # process and console plumbing
    "datasets",    # files in, batches out
    "user_model",  # the model contract
    "models",      # the built-in models and data sets on the contract
    "settings",    # flags and TF_CONFIG in, a frozen Config out
    "cluster",     # servers, the PS lifecycle, bounded waits for peers
    "graph",       # one replica's graph: model, placement, packing, sync optimizer
    "faults",      # bounds, hangs, restarts, stops
    "training",    # the session loop, hooks, evaluator, export, checkpoints
)
_TOP = ("", "experiments")
# Below the cluster in LAYERS, and still never imported by it: the cluster
# never sees a model or its data (which, lower, never see the cluster).
_CLUSTER_NEVER = ("datasets", "user_model", "models")


def _layer_of(path: str) -> str:
  """"" for a top-level module of ps_trainer/, else its sub-package."""
  parts = os.path.relpath(path, testutil.REPO_ROOT / "ps_trainer").split(os.sep)
  return parts[0] if len(parts) > 1 else ""


def _imported_layers(tree: ast.AST):
  """(line, sub-package) of every import of a ps_trainer sub-package."""
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      parts = node.module.split(".")
      if parts[0] != "ps_trainer":
        continue
      if len(parts) > 1:
        yield node.lineno, parts[1]
      else:  # from ps_trainer import x: x is a sub-package or a top module.
        for alias in node.names:
          yield node.lineno, alias.name
    elif isinstance(node, ast.Import):
      for alias in node.names:
        parts = alias.name.split(".")
        if parts[0] == "ps_trainer" and len(parts) > 1:
          yield node.lineno, parts[1]


class LayersTest(absltest.TestCase):

  def _modules(self):
    root = testutil.REPO_ROOT / "ps_trainer"
    for directory, _, files in os.walk(root):
      for name in sorted(files):
        if name.endswith(".py"):
          yield os.path.join(directory, name)

  def test_every_sub_package_has_a_layer(self):
    packages = {_layer_of(path) for path in self._modules()}
    self.assertEqual(packages - set(_TOP), set(LAYERS))

  def test_no_import_runs_back_up(self):
    problems = []
    for path in self._modules():
      layer = _layer_of(path)
      if layer in _TOP:
        continue
      with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
      where = f"{os.path.relpath(path, testutil.REPO_ROOT)}:"
      for line, imported in _imported_layers(tree):
        if imported == layer:
          continue
        if imported not in LAYERS:  # A program, from below the top.
          problems.append(f"{where}{line}: {layer} imports the top-level "
                          f"ps_trainer.{imported}")
        elif (LAYERS.index(imported) > LAYERS.index(layer)
              or (layer == "cluster" and imported in _CLUSTER_NEVER)):
          problems.append(f"{where}{line}: {layer} imports {imported}, a layer "
                          "it must not import")
    self.assertEqual(problems, [], "\n".join(problems))


if __name__ == "__main__":
  absltest.main()
