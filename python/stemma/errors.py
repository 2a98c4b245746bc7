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


_BY_CODE = {}


def _raised_for(*codes):
    """Class decorator: the gRPC status codes (by name) whose failures raise this class; the
    first is its `code`. The one table from status codes to classes."""

    def register(cls):
        cls.code = codes[0]
        for name in codes:
            _BY_CODE[grpc.StatusCode[name]] = cls
        return cls

    return register


@_raised_for("INVALID_ARGUMENT", "OUT_OF_RANGE")
class InvalidArgument(StemmaError, ValueError):
    """A bad spec, file or argument: the message names the field (and line)."""


@_raised_for("NOT_FOUND")
class NotFound(StemmaError, LookupError):
    pass


@_raised_for("ALREADY_EXISTS")
class AlreadyExists(StemmaError):
    pass


@_raised_for("PERMISSION_DENIED")
class PermissionDenied(StemmaError, PermissionError):
    """The caller's token may not do this (or a token file is readable by others)."""


@_raised_for("UNAUTHENTICATED")
class Unauthenticated(StemmaError):
    """The coordinator refused the credentials (no token, or an unknown one)."""


@_raised_for("FAILED_PRECONDITION", "ABORTED")
class FailedPrecondition(StemmaError):
    pass


@_raised_for("RESOURCE_EXHAUSTED")
class ResourceExhausted(StemmaError):
    """A quota or a rate limit."""


@_raised_for("UNAVAILABLE")
class Unavailable(StemmaError, ConnectionError):
    """The coordinator cannot be reached (not running, wrong address, TLS mismatch)."""


@_raised_for("DEADLINE_EXCEEDED")
class DeadlineExceeded(StemmaError, TimeoutError):
    """A call, or a wait, did not finish in time."""


@_raised_for("CANCELLED")
class Cancelled(StemmaError):
    pass


@_raised_for("INTERNAL", "DATA_LOSS")
class Internal(StemmaError):
    pass


@_raised_for("UNIMPLEMENTED")
class Unimplemented(StemmaError):
    """The coordinator is older than this client and lacks the call."""


class JobFailed(StemmaError):
    """`wait(..., check=True)`: a job or cell ended other than SUCCEEDED. `jobs` holds the
    ones that did (dicts as `Client.job` returns them)."""

    code = "FAILED"

    def __init__(self, message, jobs):
        super().__init__(message)
        self.jobs = jobs


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
