#!/usr/bin/env python3
"""The include rules of shared/STYLE.md, checked over the sources (tests and benchmarks
aside): each heavy dependency has one door, the coordinator and the worker never include
each other, and within a module the folders include each other one way only (no cycle between
folders: coordinator/ may include coordinator/experiments/, then never the other way round;
tests and the binaries' main.cc, which compose, are left out). Fails naming every file that breaks a rule
and every folder cycle with one include per edge. Usage: check_include_rules.py SOURCE_DIR
[--self-test]: the self-test plants one violation of each rule, and one folder cycle, in a
temporary tree and checks that each is caught."""
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
    ("OpenSSL only behind the SHA-256 door, the certificate code and the HTTPS client",
     re.compile(r"^openssl/"), [r"^common/sha256\.cc$", r"^common/auth\.cc$", r"^common/https_client\.cc$"]),
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


def folder_cycles(root: pathlib.Path):
    """Cycles between the folders of one module (a top-level source folder), one line each:
    "folder cycle: a -> b -> a (a/x.h includes b/y.h; b/y.cc includes a/z.h)"."""
    edges = {}  # folder -> {included folder: the first "file includes header" seen}
    for top in SOURCES:
        for path in sorted((root / top).rglob("*")):
            if path.suffix not in (".h", ".cc", ".cpp") or not path.is_file():
                continue
            rel = path.relative_to(root).as_posix()
            # A binary's main.cc composes its module and nothing includes it: it sits above
            # every folder, whichever folder holds it.
            if re.search(r"_test\.cc$|/tests?/|/bench/|(^|/)main\.cc$", rel):
                continue
            src = rel.rsplit("/", 1)[0]
            for header in INCLUDE.findall(path.read_text(errors="replace")):
                if "/" not in header or header.split("/", 1)[0] != top:
                    continue
                dst = header.rsplit("/", 1)[0]
                if dst != src:
                    edges.setdefault(src, {}).setdefault(dst, f"{rel} includes {header}")
    # Tarjan's strongly connected components: every component of two or more folders holds
    # a cycle; one is reported per component (a shortest one through its first folder).
    index, low, stack, on_stack, comps = {}, {}, [], set(), []
    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))
    for v in sorted(set(edges) | {w for ws in edges.values() for w in ws}):
        if v not in index:
            visit(v)
    out = []
    for comp in comps:
        start, members = comp[0], set(comp)
        paths, queue, found = {start: [start]}, [start], None
        while queue and found is None:
            v = queue.pop(0)
            for w in sorted(edges.get(v, {})):
                if w not in members:
                    continue
                if w == start:
                    found = paths[v] + [start]
                    break
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    queue.append(w)
        why = "; ".join(edges[a][b] for a, b in zip(found, found[1:]))
        out.append(f"folder cycle: {' -> '.join(found)} ({why})")
    return out


def self_test(root: pathlib.Path) -> int:
    plants = {
        "coordinator/planted_sqlite.cc": "#include <sqlite3.h>\n",
        "coordinator/planted_grpc.cc": "#include <grpcpp/grpcpp.h>\n",
        "common/planted_torch.cc": "#include <torch/torch.h>\n",
        "engine/planted_openssl.cc": "#include <openssl/evp.h>\n",
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
        # A cycle between two folders of the coordinator (the one experiment_service.h and
        # coordinator.h once formed), which no rule above sees.
        (t / "coordinator/planted").mkdir()
        (t / "coordinator/planted/service.h").write_text('#include "coordinator/core.h"\n')
        (t / "coordinator/core.h").write_text('#include "coordinator/planted/service.h"\n')
        (t / "coordinator/planted/service_test.cc").write_text('#include "coordinator/x.h"\n')
        cycles = folder_cycles(t)
        if not any("coordinator -> coordinator/planted -> coordinator" in c for c in cycles):
            missed.append("coordinator/planted/service.h <-> coordinator/core.h (folder cycle)")
        if not folder_cycles_absent_after_fix(t):
            missed.append("coordinator/planted (a one-way include reported as a cycle)")
        for m in missed:
            print(f"self-test: the planted violation {m} was not caught", file=sys.stderr)
        total = len(plants) + 2
        print(f"self-test: {total - len(missed)} of {total} planted violations caught")
        return 1 if missed else 0


def folder_cycles_absent_after_fix(t: pathlib.Path) -> bool:
    """With the planted cycle's back edge removed, no cycle is reported (one way is fine)."""
    (t / "coordinator/planted/service.h").write_text("#include <string>\n")
    return not folder_cycles(t)


def main() -> int:
    root = pathlib.Path(sys.argv[1])
    if "--self-test" in sys.argv[2:]:
        return self_test(root)
    found = violations(root) + folder_cycles(root)
    for v in found:
        print(v, file=sys.stderr)
    print(f"include rules: {len(found)} violations")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
