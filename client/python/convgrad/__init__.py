"""convgrad: convolution gradients computed by a convgrad server.

    import convgrad
    c = convgrad.Client("localhost:50051")
    dx = c.conv_backward_data(dy, w, strides=[2, 2], data_format="NCX",
                              weights_format="OIX", dst_shape=x.shape)

convgrad.torch.offload(model, target) moves the backward of a PyTorch
model's convolutions to the server. The package is a ctypes binding of
libcgclient (see README.md for how it is found)."""
from ._region import Region
from .client import CallResult, Client, Staged
from .errors import (Aborted, AlreadyExists, Cancelled, DataLoss,
                     DeadlineExceeded, Error, FailedPrecondition, Internal,
                     InvalidArgument, NotFound, OutOfRange, PermissionDenied,
                     ResourceExhausted, Unauthenticated, Unavailable,
                     Unimplemented, Unknown)

__all__ = ["Client", "CallResult", "Region", "Staged", "Error", "Cancelled",
           "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
           "AlreadyExists", "PermissionDenied", "ResourceExhausted",
           "FailedPrecondition", "Aborted", "OutOfRange", "Unimplemented",
           "Internal", "Unavailable", "DataLoss", "Unauthenticated"]
