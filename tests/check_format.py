#!/usr/bin/env python3
"""Fails when a tracked C++ file is not as clang-format (.clang-format, Google, 100 columns)
would write it. Usage: check_format.py SOURCE_DIR [--self-test].

--self-test plants a misformatted copy of a real file in a temporary tree and checks that the
check catches it, so the test cannot pass by finding nothing to look at.
Exit 77 (CTest: skipped) when clang-format is not installed."""
import os
import shutil
import subprocess
import sys
import tempfile

from source_files import tracked_sources


def clang_format():
    for name in ("clang-format-14", "clang-format"):
        path = shutil.which(name)
        if path:
            return path
    return None


def misformatted(tool, root, files):
    bad = []
    for i in range(0, len(files), 50):
        chunk = files[i:i + 50]
        res = subprocess.run([tool, "--dry-run", "--Werror", "--style=file"] + chunk, cwd=root,
                             capture_output=True, text=True)
        if res.returncode != 0:
            for line in res.stderr.splitlines():
                if ": error:" in line:
                    bad.append(line.split(":", 1)[0] + ":" + line.split(":", 2)[1])
    return bad


def main():
    root = os.path.abspath(sys.argv[1])
    tool = clang_format()
    if tool is None:
        print("clang-format not installed: skipped")
        return 77
    files = tracked_sources(root)
    if "--self-test" in sys.argv:
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(os.path.join(root, ".clang-format"), tmp)
            sample = next(f for f in files if f.endswith(".cc"))
            with open(os.path.join(root, sample)) as f:
                text = f.read()
            with open(os.path.join(tmp, "planted.cc"), "w") as f:
                f.write(text.replace("\n", "\n   ", 5) + "\nint  planted ( ) {return 1;}\n")
            if not misformatted(tool, tmp, ["planted.cc"]):
                print("self-test: a misformatted file was NOT caught")
                return 1
            print("self-test: a planted misformatted file is caught")
            return 0
    bad = misformatted(tool, root, files)
    if bad:
        print("not clang-formatted (fix: clang-format -i FILE):")
        for b in sorted(set(bad)):
            print("  " + b)
        return 1
    print(f"{len(files)} files clang-formatted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
