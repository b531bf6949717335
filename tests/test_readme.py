"""The README's usage example runs as written and does what its comments say."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_usage_example():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has a Python example"
    namespace = {}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    assert namespace["rows"].shape == (12, 8)
    assert namespace["y"].shape == (4, 8)
    assert namespace["counts"] == [2, 2, 2]


def test_docs_quickstart_installs_as_the_readme_does():
    """CI runs the README's set-up command in a fresh venv; the quickstart shows the same."""
    readme = README.read_text()
    quickstart = (README.parent / "docs" / "quickstart.rst").read_text()
    command = (
        "python3 -m venv .venv && . .venv/bin/activate && pip install -e . "
        "&& python -m moe_numba demo"
    )
    assert command in readme
    assert command in quickstart
