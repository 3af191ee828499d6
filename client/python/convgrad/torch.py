"""PyTorch integration: convgrad.torch.offload(model, target) makes the
backward of every convolution of a model run on a convgrad server.

    model = convgrad.torch.offload(model, "localhost:50051")
    loss = model(x).sum(); loss.backward()   # conv gradients: on the server

The forward stays in torch. The backward of each layer is one call: the
layer op (ConvolutionBackward / ConvTransposeBackward) sends the input,
grad_output and the weight once and answers the gradients autograd asks
for (needs_input_grad) among grad_input, grad_weight and grad_bias; a layer
whose weight and bias are frozen asks ConvolutionBackwardData /
ConvTransposeBackwardData for grad_input alone, without uploading the
input."""
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .client import Client

__all__ = ["offload", "restore"]


def _pads(m):
    """pads_begin and pads_end of module m as torch applies them: 'same'
    puts the odd unit at the end, like torch's own F.pad for it."""
    n = len(m.kernel_size)
    if m.padding == "valid":
        return [0] * n, [0] * n
    if m.padding == "same":
        total = [d * (k - 1) for d, k in zip(m.dilation, m.kernel_size)]
        begin = [t // 2 for t in total]
        return begin, [t - b for t, b in zip(total, begin)]
    return list(m.padding), list(m.padding)


def _local_dtype_ok(dtype, transposed):
    # CPU torch has no f16 convolution, and its bf16 conv_transpose (1.13)
    # rejects valid shapes.
    if dtype == torch.float16:
        return False
    return not (dtype == torch.bfloat16 and transposed)


class _ConvFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, m, output_padding):
        transposed = isinstance(m, _TRANSPOSED)
        n = len(m.kernel_size)
        begin, end = _pads(m)
        fn = _FORWARD[n][transposed]
        if transposed:
            def run(x, w, b):
                return fn(x, w, b, m.stride, m.padding, output_padding,
                          m.groups, m.dilation)
        else:
            def run(x, w, b):
                return fn(x, w, b, m.stride, m.padding, m.dilation, m.groups)
        if torch.is_autocast_cpu_enabled():
            # Whatever dtype autocast runs this op in is the one the server
            # computes the gradients in.
            y = run(x, weight, bias)
            dt = y.dtype
        else:
            dt = x.dtype
            if _local_dtype_ok(dt, transposed):
                y = run(x, weight, bias)
            else:
                y = run(x.float(), weight.float(),
                        None if bias is None else bias.float()).to(dt)
        ctx.save_for_backward(x.to(dt), weight.to(dt))
        ctx.m = m
        ctx.dtypes = (x.dtype, weight.dtype,
                      None if bias is None else bias.dtype)
        ctx.attrs = dict(strides=list(m.stride), pads_begin=begin,
                         pads_end=end, dilations=list(m.dilation),
                         groups=m.groups, data_format="NCX",
                         weights_format="IOX" if transposed else "OIX")
        if transposed:
            ctx.attrs["output_padding"] = list(output_padding)
        ctx.transposed = transposed
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        client = ctx.m._convgrad_client
        gy = gy.to(x.dtype).contiguous()
        need = ctx.needs_input_grad[:3]
        out = {}
        if need[0]:
            out["diff_src"] = torch.empty(x.shape, dtype=x.dtype)
        if need[1]:
            out["diff_weights"] = torch.empty(w.shape, dtype=w.dtype)
        if need[2]:
            out["diff_bias"] = torch.empty(
                w.shape[1] * ctx.m.groups if ctx.transposed else w.shape[0],
                dtype=x.dtype)
        if not (need[1] or need[2]):
            # grad_input alone: the BackwardData op needs no input tensor.
            if ctx.transposed:
                client.conv_transpose_backward_data(
                    gy, w, out=out["diff_src"], **ctx.attrs)
            else:
                client.conv_backward_data(gy, w, out=out["diff_src"],
                                          dst_shape=list(x.shape),
                                          **ctx.attrs)
        elif out:
            layer = (client.conv_transpose_backward if ctx.transposed
                     else client.conv_backward)
            layer(x, gy, w, outputs=list(out), out=out, **ctx.attrs)
        return tuple(None if g is None else g.to(dt) for g, dt in zip(
            (out.get(k) for k in ("diff_src", "diff_weights", "diff_bias")),
            ctx.dtypes)) + (None, None)


class _Offloaded:
    """The forward of an offloaded convolution: torch's, through
    _ConvFunction so that the backward runs on the server."""

    def _offloaded_forward(self, input, output_padding):
        n = len(self.kernel_size)
        unbatched = input.dim() == n + 1
        if unbatched:
            input = input.unsqueeze(0)
        y = _ConvFunction.apply(input, self.weight, self.bias, self,
                                output_padding)
        return y.squeeze(0) if unbatched else y


class _OffloadedConv(_Offloaded):
    def forward(self, input):
        return self._offloaded_forward(input, None)


class _OffloadedConvTranspose(_Offloaded):
    def forward(self, input, output_size=None):
        n = len(self.kernel_size)
        output_padding = self._output_padding(
            input, output_size, self.stride, self.padding, self.kernel_size,
            n, self.dilation)
        return self._offloaded_forward(input, output_padding)


_FORWARD = {1: (F.conv1d, F.conv_transpose1d),
            2: (F.conv2d, F.conv_transpose2d),
            3: (F.conv3d, F.conv_transpose3d)}
_TRANSPOSED = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_CLASSES = {}
for _base in (nn.Conv1d, nn.Conv2d, nn.Conv3d):
    _CLASSES[_base] = type("Offloaded" + _base.__name__,
                           (_OffloadedConv, _base), {})
for _base in _TRANSPOSED:
    _CLASSES[_base] = type("Offloaded" + _base.__name__,
                           (_OffloadedConvTranspose, _base), {})
_ORIGINAL = {v: k for k, v in _CLASSES.items()}


def offload(model, target, **options):
    """Makes the backward of every nn.Conv1d/2d/3d and nn.ConvTranspose1d/
    2d/3d in model (model itself included) run on a convgrad server, and
    returns model.

    target: a "host:port" (or list, "dns:///name:port", ...) for a new
    convgrad.Client made with **options (deadline=, retries=, ...), or a
    Client to share. The modules are changed in place: they keep their
    parameters, so state_dict, optimizers and DDP wrappers stay valid, and
    every constructor argument (stride, padding including 'same' and
    'valid', dilation, groups, output_padding, bias). Only these exact
    classes are offloaded, not subclasses of them, whose forward may differ.
    A padding_mode other than 'zeros' stays local, with a warning.

    f32, bf16 and f16 tensors are accepted, and torch.autocast on the CPU:
    the server computes in the dtype the forward ran in and the gradients
    come back in the parameters' dtypes. f16 forwards (and bf16
    ConvTranspose ones) run in f32 and are rounded, as CPU torch has no
    such kernels. Double backward raises a RuntimeError."""
    client = target if isinstance(target, Client) else Client(target,
                                                              **options)
    for m in model.modules():
        cls = _CLASSES.get(type(m))
        if cls is None:
            continue
        if m.padding_mode != "zeros":
            warnings.warn("convgrad: %s has padding_mode=%r; its backward "
                          "stays local" % (type(m).__name__, m.padding_mode),
                          stacklevel=2)
            continue
        m.__class__ = cls
        m._convgrad_client = client
    return model


def restore(model):
    """Undoes offload(): the convolutions of model compute their backward
    locally again. Returns model."""
    for m in model.modules():
        base = _ORIGINAL.get(type(m))
        if base is not None:
            m.__class__ = base
            del m._convgrad_client
    return model
