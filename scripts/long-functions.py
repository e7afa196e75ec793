#!/usr/bin/env python3
"""
List the functions longer than a limit (default 60 lines), longest first.

Usage: scripts/long-functions.py [--max LINES] [PATH ...]

A function's length runs from its ``def`` line to its last line (docstring
and nested functions included, decorators not). PATH is a file or a folder
searched for ``*.py`` (default: ``cotainr_lumi``). Prints one line per
function, ``LINES PATH:LINE NAME`` (methods as ``Class.name``), and exits 0.
"""

import argparse
import ast
from pathlib import Path
import sys


def long_functions(*, path, limit):
    """
    Yield (length, line, qualified name) of the functions of one file.

    Parameters
    ----------
    path : pathlib.Path
        A Python file.
    limit : int
        Functions of at most this many lines are left out.

    Yields
    ------
    function : tuple of (int, int, str)
        Its length in lines, its ``def`` line and its qualified name.
    """
    tree = ast.parse(path.read_text(), filename=str(path))

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                length = child.end_lineno - child.lineno + 1
                if length > limit:
                    yield length, child.lineno, name
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def main(argv=None):
    """Print the long functions of the given paths."""
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--max", type=int, default=60, help="longest allowed")
    parser.add_argument("paths", nargs="*", default=["cotainr_lumi"])
    args = parser.parse_args(argv)
    files = []
    for entry in map(Path, args.paths):
        files += sorted(entry.rglob("*.py")) if entry.is_dir() else [entry]
    found = [
        (length, f"{path}:{line}", name)
        for path in files
        for length, line, name in long_functions(path=path, limit=args.max)
    ]
    for length, where, name in sorted(found, key=lambda f: (-f[0], f[1])):
        print(f"{length:5d} {where} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
