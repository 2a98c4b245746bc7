#!/usr/bin/env python3
"""Fails when a function in a tracked C++ file is longer than 120 lines (first line to last,
as lizard measures it), except the daemons' main()s listed in ALLOWED with their reason.
Usage: check_function_size.py SOURCE_DIR [--self-test].

The functions are found by lizard (PyPI; scripts/setup installs it into the deploy venv,
~/.cache/stemma/venv-deploy, or $STEMMA_DEPLOY_VENV), which reads C++ without compiling it:
the whole tree takes seconds, where clang-tidy's readability-function-size would compile
every LibTorch translation unit again.

--self-test plants a file with one function over the limit and one under it, and checks that
exactly the long one is caught, so the test cannot pass by finding nothing to look at.
Exit 77 (CTest: skipped) when lizard is not installed."""
import csv
import io
import os
import shutil
import subprocess
import sys
import tempfile

from source_files import tracked_sources

MAX_LINES = 120

# (file, function as lizard names it) -> why it may be longer. Only the daemons' mains, which
# compose: they parse flags, build the typed config and wire the parts together.
ALLOWED = {
    ("coordinator/main.cc", "main"):
        "the coordinator daemon's main: flags, config, store, services, servers, shutdown",
    ("worker/main.cc", "stemma::worker::Main"):
        "the worker daemon's main: flags, config, resources, executor, session, shutdown",
}


def lizard():
    venv = os.environ.get("STEMMA_DEPLOY_VENV",
                          os.path.expanduser("~/.cache/stemma/venv-deploy"))
    for path in (os.path.join(venv, "bin", "lizard"), shutil.which("lizard")):
        if path and os.access(path, os.X_OK):
            return path
    return None


def long_functions(tool, root, files):
    """(file, function, lines, first line) of every function longer than MAX_LINES."""
    found = []
    for i in range(0, len(files), 200):
        res = subprocess.run([tool, "--languages", "cpp", "--csv"] + files[i:i + 200], cwd=root,
                             capture_output=True, text=True)
        if res.returncode not in (0, 1):
            raise RuntimeError(f"lizard failed: {res.stderr.strip()}")
        # nloc, ccn, tokens, parameters, length, location, file, name, long name, start, end
        for row in csv.reader(io.StringIO(res.stdout)):
            if len(row) < 11 or not row[4].isdigit():
                continue
            if int(row[4]) > MAX_LINES:
                found.append((row[6], row[7], int(row[4]), int(row[9])))
    return found


def main():
    root = os.path.abspath(sys.argv[1])
    tool = lizard()
    if tool is None:
        print("lizard not installed (scripts/setup): skipped")
        return 77
    if "--self-test" in sys.argv:
        with tempfile.TemporaryDirectory() as tmp:
            body = "".join(f"  total += {i};\n" for i in range(MAX_LINES))
            short = "".join(f"  total += {i};\n" for i in range(MAX_LINES - 10))
            with open(os.path.join(tmp, "planted.cc"), "w") as f:
                f.write("namespace planted {\nint TooLong(int total) {\n" + body +
                        "  return total;\n}\n\nint ShortEnough(int total) {\n" + short +
                        "  return total;\n}\n}  // namespace planted\n")
            found = long_functions(tool, tmp, ["planted.cc"])
            names = [name for _, name, _, _ in found]
            if names != ["planted::TooLong"]:
                print(f"self-test: expected only planted::TooLong to be caught, got {names}")
                return 1
            print(f"self-test: a planted {found[0][2]}-line function is caught, a shorter one not")
            return 0
    files = tracked_sources(root)
    too_long = [f for f in long_functions(tool, root, files) if (f[0], f[1]) not in ALLOWED]
    if too_long:
        print(f"functions over {MAX_LINES} lines (split them by concern):")
        for path, name, lines, start in sorted(too_long):
            print(f"  {path}:{start}: {name}: {lines} lines")
        return 1
    print(f"{len(files)} files: no function over {MAX_LINES} lines "
          f"(allowed: {', '.join(sorted(n for _, n in ALLOWED))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
