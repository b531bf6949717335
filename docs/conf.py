"""Sphinx configuration of the moe-numba documentation.

Build: ``sphinx-build -W -b html docs docs/_build/html`` (or ``tox -e docs``). The API pages
import the installed ``moe_numba`` and ``moe_cpu`` (``pip install -e .``); no GPU is needed.
"""

import importlib.metadata
import sys
from pathlib import Path

# A checkout whose extensions were built in place (``pip install -e .`` does that) works
# without an install.
try:
    release = importlib.metadata.version("moe-numba")
except importlib.metadata.PackageNotFoundError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    release = "(not installed)"

project = "moe-numba"
author = "the moe-numba developers"
copyright = "the moe-numba developers"
version = release

extensions = [
    "sphinx.ext.autodoc",
    "numpydoc",
]
# No math extension: formulas are written in plain text with sub/superscripts, so the pages
# render offline (sphinx.ext.mathjax would load MathJax from a CDN); a stray :math: role
# fails the -W build.

# lab-notes.rst is the developers' notebook of dated runs: kept in the repository beside the
# pages it once belonged to (the code's comments cite it there), not published
exclude_patterns = ["_build", "examples", "lab-notes.rst"]
templates_path = []
default_role = "code"  # `x` renders as code, as in the numpydoc docstrings
highlight_language = "python"

# autodoc + numpydoc
autodoc_typehints = "none"  # the numpydoc Parameters sections carry the types
numpydoc_show_class_members = False
numpydoc_xref_param_type = False
# Every public function documents every argument and what it returns; a gap fails the
# build under -W.
numpydoc_validation_checks = {"GL08", "PR01", "PR02", "PR07", "RT01", "SS01"}

# alabaster ships with Sphinx: no theme dependency.
html_theme = "alabaster"
html_theme_options = {
    "description": "MoE token permute / unpermute for NumPy and CUDA arrays",
    "fixed_sidebar": True,
    "page_width": "1100px",
    "sidebar_width": "230px",
    "show_relbars": True,
}
html_static_path = ["_static"]
html_show_sourcelink = False
