#!/usr/bin/env python3
"""The include rules of shared/STYLE.md, checked over the sources (tests and benchmarks
aside): each heavy dependency has one door, and the coordinator and the worker never include
each other. Fails naming every file that breaks a rule. Usage: check_include_rules.py SOURCE_DIR
[--self-test]: the self-test plants one violation of each rule in a temporary tree and
checks that it is caught."""
import pathlib
import re
import shutil
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
SOURCES = ("common", "coordinator", "worker", "cli", "engine", "proto")

# (name, pattern of included headers, the places allowed to include them)
RULES = [
    ("sqlite3.h only in the store", re.compile(r"^sqlite3\.h$"), [r"^coordinator/store/"]),
    ("grpcpp only in the rpc adapters and the CLI client",
     re.compile(r"^(grpcpp/|grpc\+\+/|grpc/|.*\.grpc\.pb\.h$)"),
     [r"^common/rpc\.(h|cc)$", r"^coordinator/rpc/", r"^coordinator/main\.cc$", r"^worker/session\.(h|cc)$",
      r"_test\.cc$", r"^worker/main\.cc$", r"^cli/client\.(h|cc)$"]),
    ("LibTorch only under engine/", re.compile(r"^(torch/|ATen/|c10/|caffe2/)"), [r"^engine/"]),
    ("the coordinator never includes the worker", re.compile(r"^worker/"), [r"^(?!coordinator/)"]),
    ("the worker never includes the coordinator", re.compile(r"^coordinator/"), [r"^(?!worker/)"]),
    ("the engine never includes the control plane", re.compile(r"^(coordinator|worker|cli)/"), [r"^(?!engine/)"]),
    ("common includes no daemon or engine code", re.compile(r"^(coordinator|worker|cli|engine)/"), [r"^(?!common/)"]),
]


def violations(root: pathlib.Path):
    out = []
    for top in SOURCES:
        for path in sorted((root / top).rglob("*")):
            if path.suffix not in (".h", ".cc", ".cpp") or not path.is_file():
                continue
            rel = path.relative_to(root).as_posix()
            for header in INCLUDE.findall(path.read_text(errors="replace")):
                for name, pattern, allowed in RULES:
                    if pattern.search(header) and not any(re.search(a, rel) for a in allowed):
                        out.append(f"{rel}: includes {header} ({name})")
    return out


def self_test(root: pathlib.Path) -> int:
    plants = {
        "coordinator/planted_sqlite.cc": "#include <sqlite3.h>\n",
        "coordinator/planted_grpc.cc": "#include <grpcpp/grpcpp.h>\n",
        "common/planted_torch.cc": "#include <torch/torch.h>\n",
        "coordinator/planted_worker.cc": '#include "worker/executor.h"\n',
        "worker/planted_coordinator.cc": '#include "coordinator/job_table.h"\n',
        "engine/planted_cli.cc": '#include "cli/client.h"\n',
        "common/planted_engine.cc": '#include "engine/events.h"\n',
    }
    with tempfile.TemporaryDirectory() as tmp:
        t = pathlib.Path(tmp)
        for top in SOURCES:
            (t / top).mkdir()
        for rel, text in plants.items():
            (t / rel).write_text(text)
        found = violations(t)
        missed = [rel for rel in plants if not any(v.startswith(rel + ":") for v in found)]
        for m in missed:
            print(f"self-test: the planted violation {m} was not caught", file=sys.stderr)
        print(f"self-test: {len(plants) - len(missed)} of {len(plants)} planted violations caught")
        return 1 if missed else 0


def main() -> int:
    root = pathlib.Path(sys.argv[1])
    if "--self-test" in sys.argv[2:]:
        return self_test(root)
    found = violations(root)
    for v in found:
        print(v, file=sys.stderr)
    print(f"include rules: {len(found)} violations")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
