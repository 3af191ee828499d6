"""The exceptions every convgrad call raises: one class per gRPC status
code, all subclasses of convgrad.Error."""


class Error(Exception):
    """A failed convgrad call.

    code: the gRPC status code (int; 3 = INVALID_ARGUMENT, ...);
    code_name: its name ("INVALID_ARGUMENT");
    message: the server's message, or what the client found wrong;
    errno: libcgclient's return value (-20 = the server answered with an
    error status; other negative values are local failures), or None for a
    failure found in Python before calling the library."""

    code = 2
    code_name = "UNKNOWN"

    def __init__(self, message, code=None, errno=None):
        super().__init__(message)
        if code is not None:
            self.code = code
            self.code_name = _NAMES.get(code, "UNKNOWN")
        self.message = message
        self.errno = errno

    def __str__(self):
        return "%s: %s" % (self.code_name, self.message)


_NAMES = {}
_CLASSES = {}


def _define(name, code, doc):
    cls = type("".join(w.capitalize() for w in name.split("_")), (Error,),
               {"code": code, "code_name": name, "__doc__": doc})
    _NAMES[code] = name
    _CLASSES[code] = cls
    return cls


Cancelled = _define("CANCELLED", 1, "The call was cancelled.")
Unknown = _define("UNKNOWN", 2, "An error without a better code.")
InvalidArgument = _define("INVALID_ARGUMENT", 3,
                          "The request is malformed: a bad attribute, shape "
                          "or array.")
DeadlineExceeded = _define("DEADLINE_EXCEEDED", 4,
                           "The call's deadline passed.")
NotFound = _define("NOT_FOUND", 5, "Unknown method or health service.")
AlreadyExists = _define("ALREADY_EXISTS", 6, "ALREADY_EXISTS.")
PermissionDenied = _define("PERMISSION_DENIED", 7, "PERMISSION_DENIED.")
ResourceExhausted = _define("RESOURCE_EXHAUSTED", 8,
                            "A limit was hit (request size, flops, an out= "
                            "array too small), or the server still said "
                            "\"retry later\" (queue, memory) after the "
                            "client's retries.")
FailedPrecondition = _define("FAILED_PRECONDITION", 9, "FAILED_PRECONDITION.")
Aborted = _define("ABORTED", 10, "ABORTED.")
OutOfRange = _define("OUT_OF_RANGE", 11, "OUT_OF_RANGE.")
Unimplemented = _define("UNIMPLEMENTED", 12,
                        "The server does not support this (op, dtype...).")
Internal = _define("INTERNAL", 13, "A server or client bug.")
Unavailable = _define("UNAVAILABLE", 14,
                      "No server answered (after the client's retries).")
DataLoss = _define("DATA_LOSS", 15, "DATA_LOSS.")
Unauthenticated = _define("UNAUTHENTICATED", 16, "UNAUTHENTICATED.")


def from_status(code, message, errno=None):
    """The exception instance for a gRPC status code."""
    return _CLASSES.get(code, Unknown)(message, code, errno)
