"""The C++ files the tree-wide checks read (check_format.py, check_function_size.py)."""
import os
import subprocess


def tracked_sources(root):
    """Every git-tracked .cc/.h below root, sorted; outside a git checkout (a source
    tarball), every .cc/.h below the tree's own folders (no hidden or build folders)."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "*.cc", "*.h"], check=True,
                             capture_output=True, text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = []
        for top, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if not d.startswith(".") and not d.startswith("build")]
            out += [os.path.relpath(os.path.join(top, f), root) for f in files
                    if f.endswith((".cc", ".h"))]
    return sorted(out)
