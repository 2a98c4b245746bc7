"""Builds the `stemma` package: the protobuf and gRPC modules are generated here, from the
repository's proto/ (../proto beside this directory, or $STEMMA_PROTO_DIR, or the proto/
copy an sdist carries), with grpcio-tools, into the build tree. Nothing generated is kept
in the source tree."""

import os
import pathlib
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = pathlib.Path(__file__).resolve().parent


def proto_root():
    candidates = [os.environ.get("STEMMA_PROTO_DIR"), HERE.parent / "proto", HERE / "proto"]
    for c in candidates:
        if c and (pathlib.Path(c) / "stemma" / "v1" / "user_service.proto").is_file():
            return pathlib.Path(c)
    raise SystemExit(
        "stemma: cannot find proto/stemma/v1/*.proto (install from a Stemma checkout with "
        "`pip install ./python`, or set STEMMA_PROTO_DIR)")


def generator_versions():
    """The grpcio and protobuf that the generated modules need at run time: the versions of
    the grpcio-tools that generates them and of its protobuf (their run-time checks refuse
    older ones)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("grpcio-tools"), version("protobuf")
    except PackageNotFoundError as e:
        raise SystemExit(f"stemma: building needs grpcio-tools ({e}): pip install grpcio-tools, "
                         "or let pip's build isolation install it") from None


def generate(out_dir):
    from grpc_tools import protoc

    root = proto_root()
    protos = sorted(str(p.relative_to(root)) for p in (root / "stemma").rglob("*.proto"))
    include = pathlib.Path(protoc.__file__).parent / "_proto"  # google/protobuf/*.proto
    out_dir.mkdir(parents=True, exist_ok=True)
    args = ["grpc_tools.protoc", f"-I{root}", f"-I{include}", f"--python_out={out_dir}",
            f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}", *protos]
    if protoc.main(args) != 0:
        raise SystemExit("stemma: protoc failed on " + " ".join(protos))
    for package in ("stemma/v1", "stemma/v1/specs"):
        init = out_dir / package / "__init__.py"
        if not init.exists():
            init.write_text('"""Generated from proto/ at build time (setup.py)."""\n')


class BuildPyWithProtos(build_py):
    def run(self):
        super().run()
        generate(pathlib.Path(self.build_lib))


class SdistWithProtos(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        shutil.copytree(proto_root() / "stemma", pathlib.Path(base_dir) / "proto" / "stemma")


tools_version, protobuf_version = generator_versions()
setup(
    cmdclass={"build_py": BuildPyWithProtos, "sdist": SdistWithProtos},
    install_requires=[f"grpcio>={tools_version}", f"protobuf>={protobuf_version}", "PyYAML>=5.1"],
)
