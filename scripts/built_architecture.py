#!/usr/bin/env python3
"""One architecture from build to deploy.

`make build` runs `pin` after `sam build`: it reads the CPU architecture of the built
bootstrap (its ELF header) and pins the built template's `Architecture` parameter to it
(the default and the only allowed value), so that `sam deploy --guided` offers the
architecture that was built and CloudFormation refuses any other.

`make deploy` runs `check` before deploying: the built template's pin must match the
bootstrap, and ARCH when the command line names one. Each failure is one line; the exit
status is 1.

Usage:
  built_architecture.py pin   BUILT_TEMPLATE BOOTSTRAP
  built_architecture.py check BUILT_TEMPLATE BOOTSTRAP [WANTED_ARCH]
"""

import re
import sys

# e_machine of the ELF header (offset 18, little-endian on both) -> Lambda's name.
MACHINES = {0x3E: "x86_64", 0xB7: "arm64"}
PINNED = "pinned to the architecture of the bootstrap in this build"


def fail(message):
    print(f"built architecture: {message}", file=sys.stderr)
    sys.exit(1)


def bootstrap_architecture(path):
    try:
        with open(path, "rb") as f:
            header = f.read(20)
    except OSError as e:
        fail(f"{path}: {e.strerror}; run make build first")
    if len(header) < 20 or header[:4] != b"\x7fELF":
        fail(f"{path} is not an ELF binary; run make build first")
    machine = int.from_bytes(header[18:20], "little")
    if machine not in MACHINES:
        fail(f"{path} is built for ELF machine {machine:#x}, which Lambda does not run")
    return MACHINES[machine]


def parameter_block(lines):
    """The [start, end) line range of Parameters.Architecture, or None."""
    in_parameters = False
    for i, line in enumerate(lines):
        if re.match(r"^Parameters:\s*$", line):
            in_parameters = True
            continue
        if in_parameters and re.match(r"^\S", line):
            return None
        if in_parameters and re.match(r"^  Architecture:\s*$", line):
            end = i + 1
            while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
                end += 1
            return i, end
    return None


def pinned_architecture(lines, block):
    start, end = block
    for line in lines[start:end]:
        m = re.match(r"^    Default:\s*['\"]?([A-Za-z0-9_]+)['\"]?\s*$", line)
        if m:
            return m.group(1)
    return None


def read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines(keepends=True)
    except OSError as e:
        fail(f"{path}: {e.strerror}; run make build first")


def pin(template, bootstrap):
    arch = bootstrap_architecture(bootstrap)
    lines = read(template)
    block = parameter_block(lines)
    if block is None:
        fail(f"{template} has no Parameters.Architecture to pin")
    start, end = block
    lines[start:end] = [
        "  Architecture:\n",
        "    Type: String\n",
        f"    Default: {arch}\n",
        f"    AllowedValues: [{arch}]\n",
        f"    Description: CPU architecture of the function, {PINNED} ({arch}).\n",
    ]
    with open(template, "w", encoding="utf-8") as f:
        f.writelines(lines)
    print(arch)


def check(template, bootstrap, wanted=None):
    arch = bootstrap_architecture(bootstrap)
    lines = read(template)
    block = parameter_block(lines)
    pinned = pinned_architecture(lines, block) if block else None
    if pinned != arch or not any(PINNED in line for line in lines):
        fail(f"{template} is not pinned to the bootstrap's {arch}; run make build ARCH={arch} again")
    if wanted and wanted != arch:
        fail(f"ARCH={wanted} but the build is {arch}: run make build ARCH={wanted} first, or deploy without ARCH")
    print(arch)


def main(argv):
    if len(argv) >= 3 and argv[0] == "pin" and len(argv) == 3:
        pin(argv[1], argv[2])
    elif len(argv) in (3, 4) and argv[0] == "check":
        check(*argv[1:])
    else:
        fail(__doc__.strip().splitlines()[-2].strip() + " | " + __doc__.strip().splitlines()[-1].strip())


if __name__ == "__main__":
    main(sys.argv[1:])
