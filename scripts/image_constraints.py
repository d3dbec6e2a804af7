#!/usr/bin/env python3
"""Prints pip constraints for adding the project to a Python whose own packages must not change
(the -trtllm-python-py3 image: its torch and TensorRT-LLM, and what they were built against):
every distribution installed in this interpreter at its installed version, then, for packages not
installed, the project's pins from the constraints files given (resolved for the image's Python and
platform, as constraints-image.txt is). pip then installs only what the image lacks, or stops
naming the package whose pin would change one the image has.

    python3 scripts/image_constraints.py constraints-image.txt > /tmp/constraints.txt
"""
import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.version import InvalidVersion, Version


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def valid(version: str) -> bool:
    try:
        Version(version)
    except InvalidVersion:
        return False
    return True


def installed() -> dict[str, str]:
    found = {}
    for distribution in metadata.distributions():
        name = distribution.metadata["Name"]
        if name and valid(distribution.version):  # pip cannot pin a nameless or non-PEP 440 install either
            found.setdefault(normalized(name), f"{name}=={distribution.version}")
    return found


def constraints(pin_files: list[Path]) -> list[str]:
    have = installed()
    lines = sorted(have.values(), key=str.lower)
    for pin_file in pin_files:
        for line in pin_file.read_text().splitlines():
            pin = line.split("#")[0].strip()
            if "==" in pin and normalized(pin.split("==")[0].split("[")[0]) not in have:
                lines.append(pin)
    return lines


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(f"usage: {sys.argv[0]} CONSTRAINTS_FILE...")
    print("\n".join(constraints([Path(arg) for arg in sys.argv[1:]])))
