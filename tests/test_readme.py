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
