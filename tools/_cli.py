"""The command lines of the scripts in tools/: each refuses a bad option with argparse's
error (exit status 2, the usage and the reason, no traceback) before any work starts."""

from __future__ import annotations

import argparse


def parser(doc):
    """An ``ArgumentParser`` whose ``--help`` shows the script's docstring ``doc`` as written."""
    return argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def positive_int(text):
    """An argparse ``type``: an int of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 1; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1; got {value}")
    return value
