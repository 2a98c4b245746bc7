#!/usr/bin/env python3
"""docs/cli.md carries every command's `--help`, generated from the CLI itself, so that the
reference and the flags cannot drift. The part between the markers is exactly what this
script builds from `stemma [COMMAND...] --help` for the whole command tree.
Usage: check_cli_docs.py STEMMA_BIN SOURCE_DIR [--fix]"""
import os
import pathlib
import subprocess
import sys

BEGIN = "<!-- BEGIN GENERATED: stemma --help, by tests/check_cli_docs.py -->"
END = "<!-- END GENERATED -->"


def help_text(stemma: str, path: list) -> str:
    env = dict(os.environ, HOME="/nonexistent", STEMMA_CONFIG="/nonexistent/config.yaml")
    out = subprocess.run([stemma, *path, "--help"], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"stemma {' '.join(path)} --help exited {out.returncode}: {out.stderr}")
    return out.stdout


def subcommands(text: str) -> list:
    """The names CLI11 lists under 'Subcommands:'."""
    names, inside = [], False
    for line in text.splitlines():
        if line.startswith("Subcommands:"):
            inside = True
            continue
        if inside:
            if not line.startswith("  ") or not line.strip():
                if line.strip():
                    inside = False
                continue
            name = line.split()[0]
            if not line.startswith("   "):  # a description's continuation is indented deeper
                names.append(name)
    return names


def generate(stemma: str) -> str:
    sections, queue = [], [[]]
    while queue:
        path = queue.pop(0)
        text = help_text(stemma, path)
        title = " ".join(["stemma", *path])
        sections.append(f"### `{title}`\n\n```text\n{text.rstrip()}\n```\n")
        queue[0:0] = [path + [name] for name in subcommands(text)]
    return "\n".join(sections)


def main() -> int:
    stemma, source = sys.argv[1], pathlib.Path(sys.argv[2])
    fix = "--fix" in sys.argv[3:]
    page = source / "docs" / "cli.md"
    want = generate(stemma)
    text = page.read_text() if page.exists() else ""
    if BEGIN not in text or END not in text:
        if not fix:
            print(f"{page}: no '{BEGIN}' ... '{END}' section")
            return 1
        text = f"{text.rstrip()}\n\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    body, tail = rest.split(END, 1)
    if body.strip("\n") == want.strip("\n"):
        return 0
    if fix:
        page.write_text(f"{head}{BEGIN}\n{want.rstrip()}\n{END}{tail}")
        print(f"{page}: regenerated")
        return 0
    print(f"{page}: the generated reference differs from the commands' --help "
          "(run tests/check_cli_docs.py <build>/bin/stemma . --fix)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
