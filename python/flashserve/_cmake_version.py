"""The project's version as the top-level CMakeLists.txt writes it: project(flashserve VERSION x.y.z).

That line is the one place the version is written. setup.py runs this file (without importing the
package) to stamp the wheel's metadata and the installed package's _version.py; a package used
from its source checkout (PYTHONPATH=python) reads the checkout's CMakeLists.txt with it.
"""

import re

_PROJECT = re.compile(r"^\s*project\(\s*flashserve\s+VERSION\s+([0-9]+\.[0-9]+\.[0-9]+)\b",
                      re.MULTILINE)


def read(cmakelists):
    """The x.y.z of project(flashserve VERSION x.y.z) in the file `cmakelists`."""
    with open(cmakelists, encoding="utf-8") as f:
        match = _PROJECT.search(f.read())
    if match is None:
        raise RuntimeError(f"{cmakelists} has no line 'project(flashserve VERSION x.y.z ...)'")
    return match.group(1)
