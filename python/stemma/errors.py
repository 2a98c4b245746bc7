"""Typed errors: every failed call raises a `StemmaError` subclass chosen by the gRPC status
code, carrying the coordinator's own message (the same text the CLI prints after
`stemma: error:`)."""

import grpc


class StemmaError(Exception):
    """A call to the coordinator failed. `code` is the gRPC status code's name
    ("NOT_FOUND"), `message` the coordinator's text."""

    code = "UNKNOWN"

    def __init__(self, message, code=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class InvalidArgument(StemmaError, ValueError):
    """A bad spec, file or argument: the message names the field (and line)."""

    code = "INVALID_ARGUMENT"


class NotFound(StemmaError, LookupError):
    code = "NOT_FOUND"


class AlreadyExists(StemmaError):
    code = "ALREADY_EXISTS"


class PermissionDenied(StemmaError, PermissionError):
    """The caller's token may not do this (or a token file is readable by others)."""

    code = "PERMISSION_DENIED"


class Unauthenticated(StemmaError):
    """The coordinator refused the credentials (no token, or an unknown one)."""

    code = "UNAUTHENTICATED"


class FailedPrecondition(StemmaError):
    code = "FAILED_PRECONDITION"


class ResourceExhausted(StemmaError):
    """A quota or a rate limit."""

    code = "RESOURCE_EXHAUSTED"


class Unavailable(StemmaError, ConnectionError):
    """The coordinator cannot be reached (not running, wrong address, TLS mismatch)."""

    code = "UNAVAILABLE"


class DeadlineExceeded(StemmaError, TimeoutError):
    """A call, or a wait, did not finish in time."""

    code = "DEADLINE_EXCEEDED"


class Cancelled(StemmaError):
    code = "CANCELLED"


class Internal(StemmaError):
    code = "INTERNAL"


class Unimplemented(StemmaError):
    """The coordinator is older than this client and lacks the call."""

    code = "UNIMPLEMENTED"


class JobFailed(StemmaError):
    """`wait(..., check=True)`: a job or cell ended other than SUCCEEDED. `jobs` holds the
    ones that did (dicts as `Client.job` returns them)."""

    code = "FAILED"

    def __init__(self, message, jobs):
        super().__init__(message)
        self.jobs = jobs


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.DATA_LOSS: Internal,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
}


def from_rpc_error(error, address):
    """The one conversion of a grpc.RpcError into what the user reads (as cli/client.cc
    words it: the address for connection trouble, the coordinator's message otherwise)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = (error.details() if hasattr(error, "details") else None) or str(error)
    cls = _BY_CODE.get(code, StemmaError)
    lower = details.lower()
    if code == grpc.StatusCode.UNAVAILABLE:
        if any(w in lower for w in ("ssl", "handshake", "tls", "certificate")):
            text = (f"cannot reach the coordinator at {address} over TLS: {details} "
                    "(check ca= / STEMMA_CA and that the coordinator serves TLS)")
        elif "failed to connect" in lower and any(
                w in lower for w in ("socket closed", "connection reset", "eof")):
            text = (f"the coordinator at {address} closed the connection during setup "
                    f"({details}): if it serves TLS, give its CA with ca= or STEMMA_CA")
        else:
            text = f"cannot reach the coordinator at {address} ({details})"
    elif code == grpc.StatusCode.UNAUTHENTICATED:
        text = f"the coordinator at {address} refused the credentials: {details}"
    else:
        text = details
    return cls(text, code.name if code is not None else None)
