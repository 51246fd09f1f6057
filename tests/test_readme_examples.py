"""The docs' example of a test of your own passes as written (docs/development.md)."""

import re

from absl.testing import absltest

import testutil

# The fenced block after the sentence that introduces it.
_EXAMPLE = re.compile(r"For example \(`\./launch\.sh test tests/test_my_model\.py`[^\n]*\n\n"
                      r"```python\n(.*?)```", re.DOTALL)


class ReadmeExampleTest(absltest.TestCase):

  def test_the_test_of_your_own_passes_as_written(self):
    page = (testutil.REPO_ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    found = _EXAMPLE.search(page)
    self.assertIsNotNone(found, "docs/development.md: the example of a test of your own is gone")
    namespace = {"__name__": "test_my_model"}
    exec(compile(found.group(1), "docs/development.md (test_my_model.py)", "exec"), namespace)  # pylint: disable=exec-used
    tests = [value for name, value in namespace.items() if name.startswith("test_")]
    self.assertLen(tests, 1)
    tests[0]()  # Raises, and so fails here, where the example's assertions fail.


if __name__ == "__main__":
  absltest.main()
