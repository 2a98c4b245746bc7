#!/usr/bin/env python3
"""Every engine command has a reference page docs/engine/<command>.md whose generated part is
exactly what `stemma explain <command> --markdown` prints from the schema, so the docs and the
spec cannot drift. Usage: check_engine_docs.py STEMMA_BIN SOURCE_DIR [--fix]"""
import os
import pathlib
import subprocess
import sys

BEGIN = "<!-- BEGIN GENERATED: stemma explain {} -->"
END = "<!-- END GENERATED -->"


def main() -> int:
    stemma, source = sys.argv[1], pathlib.Path(sys.argv[2])
    fix = "--fix" in sys.argv[3:]
    # No config of the developer's (a broken one would fail every call), as check_cli_docs.py.
    env = dict(os.environ, HOME="/nonexistent", STEMMA_CONFIG="/nonexistent/config.yaml")
    listing = subprocess.run([stemma, "explain"], check=True, capture_output=True, text=True,
                             env=env).stdout
    commands = [line.strip() for line in listing.splitlines()[1:] if line.strip()]
    failures = []
    for command in commands:
        page = source / "docs" / "engine" / f"{command}.md"
        want = subprocess.run([stemma, "explain", command, "--markdown"], check=True,
                              capture_output=True, text=True, env=env).stdout
        if not page.exists():
            failures.append(f"{page}: missing (every engine command has a reference page)")
            continue
        text = page.read_text()
        begin = BEGIN.format(command)
        if begin not in text or END not in text:
            failures.append(f"{page}: no '{begin}' ... '{END}' section")
            continue
        head, rest = text.split(begin, 1)
        body, tail = rest.split(END, 1)
        if body.strip("\n") != want.strip("\n"):
            if fix:
                page.write_text(f"{head}{begin}\n{want.rstrip()}\n{END}{tail}")
                print(f"{page}: regenerated")
            else:
                failures.append(f"{page}: the generated section differs from `stemma explain "
                                f"{command} --markdown` (run tests/check_engine_docs.py "
                                f"<build>/bin/stemma . --fix)")
    for f in failures:
        print(f, file=sys.stderr)
    print(f"checked {len(commands)} reference pages, {len(failures)} problems")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
