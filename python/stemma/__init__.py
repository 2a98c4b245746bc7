"""Stemma from Python: a client of the coordinator's gRPC API (docs/python.md).

    import stemma
    c = stemma.Client()                    # the CLI's coordinator, token and CA
    ids = c.submit({"name": "hello", "noop": {"duration_ms": 100}})
    c.wait(ids, check=True)
    c.sweep("configs/studies/family-experts-tiny.yaml")
    df = c.metrics("family-experts-tiny", name="loss")
"""

from ._version import __version__
from .client import Client, looks_like_job_id
from .errors import (AlreadyExists, Cancelled, DeadlineExceeded, FailedPrecondition, Internal,
                     InvalidArgument, JobFailed, NotFound, PermissionDenied, ResourceExhausted,
                     StemmaError, Unauthenticated, Unavailable, Unimplemented)

__all__ = [
    "__version__", "Client", "looks_like_job_id", "StemmaError", "AlreadyExists", "Cancelled",
    "DeadlineExceeded", "FailedPrecondition", "Internal", "InvalidArgument", "JobFailed",
    "NotFound", "PermissionDenied", "ResourceExhausted", "Unauthenticated", "Unavailable",
    "Unimplemented"
]
