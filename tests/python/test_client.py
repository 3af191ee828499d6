#!/usr/bin/python3
"""test_client.py - the convgrad package (ctypes over libcgclient) against a
real convgrad-server: every op against torch autograd in f32, bf16 and f16,
numpy and torch arrays, both layouts, out= reuse, non-contiguous inputs,
error classes with their gRPC codes, concurrent calls from threads, health
and info, shared-memory regions (torch tensors and numpy arrays in a
Region travel by reference, inputs and out= alike).

Ground truth is torch autograd in float64 on the inputs rounded to the
request's dtype. Usage: test_client.py --server PATH (with CONVGRAD_LIBRARY
set); exits 1 when a check fails."""
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest

import cgtest

import numpy as np
import torch
import torch.nn.functional as F

import convgrad

ARGS = None
SERVER = None
TORCH_DT = {"f32": torch.float32, "bf16": torch.bfloat16,
            "f16": torch.float16}

# (name, spatial, N, IC, OC, in_size, kernel, stride, pad, dilation, groups,
#  output_padding for ConvTranspose)
CASES = [
    ("1d", 1, 2, 4, 6, (11,), (3,), (2,), (1,), (1,), 2, (1,)),
    ("2d", 2, 2, 3, 4, (9, 8), (3, 2), (1, 2), (1, 0), (1, 1), 1, (0, 1)),
    ("2d-dil-grp", 2, 1, 8, 8, (10, 10), (3, 3), (2, 2), (2, 2), (2, 2), 4,
     (1, 1)),
    ("3d", 3, 1, 2, 3, (5, 6, 4), (2, 3, 2), (1, 1, 2), (0, 1, 1), (1, 1, 1),
     1, (0, 0, 1)),
]


def attrs_of(case, transposed, **extra):
    _, _, _, _, _, _, _, s, p, d, g, op = case
    a = dict(strides=list(s), pads_begin=list(p), pads_end=list(p),
             dilations=list(d), groups=g, data_format="NCX",
             weights_format="IOX" if transposed else "OIX")
    if transposed:
        a["output_padding"] = list(op)
    a.update(extra)
    return a


def reference(case, transposed, dt, seed):
    """Inputs rounded to dt and the float64 autograd gradients: returns
    (x, w, dy, dx, dw) with x, w, dy in dt."""
    _, nsp, n, ic, oc, size, k, s, p, d, g, op = case
    gen = torch.Generator().manual_seed(seed)
    fwd = [None, (F.conv1d, F.conv_transpose1d), (F.conv2d,
           F.conv_transpose2d), (F.conv3d, F.conv_transpose3d)][nsp]
    if transposed:
        wshape = (ic, oc // g) + k
    else:
        wshape = (oc, ic // g) + k
    x = torch.randn((n, ic) + size, generator=gen).to(dt)
    w = torch.randn(wshape, generator=gen).to(dt)
    x64 = x.double().requires_grad_()
    w64 = w.double().requires_grad_()
    if transposed:
        y = fwd[1](x64, w64, None, s, p, op, g, d)
    else:
        y = fwd[0](x64, w64, None, s, p, d, g)
    dy = torch.randn(y.shape, generator=gen).to(dt)
    y.backward(dy.double())
    return x, w, dy, x64.grad, w64.grad


def to_numpy(t):
    """numpy form of a tensor: bf16 as its uint16 bits."""
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np.uint16)
    return t.contiguous().numpy()


def from_numpy(a, dt):
    if dt == "bf16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


class Ops(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = convgrad.Client(SERVER.target, deadline=30)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()

    def run_case(self, case, dt, transposed, numpy_arrays):
        x, w, dy, dx_ref, dw_ref = reference(case, transposed, TORCH_DT[dt],
                                             CASES.index(case))
        a = attrs_of(case, transposed)
        if numpy_arrays:
            x, w, dy = to_numpy(x), to_numpy(w), to_numpy(dy)
        if transposed:
            dx = self.c.conv_transpose_backward_data(dy, w, **a)
            dw = self.c.conv_transpose_backward_weights(
                x, dy, weights_shape=list(w.shape), **a)
        else:
            dx = self.c.conv_backward_data(dy, w, dst_shape=list(x.shape),
                                           **a)
            dw = self.c.conv_backward_weights(x, dy,
                                              weights_shape=list(w.shape),
                                              **a)
        for name, got, ref in (("diff_src", dx, dx_ref),
                               ("diff_weights", dw, dw_ref)):
            if numpy_arrays:
                self.assertIsInstance(got, np.ndarray)
                got = from_numpy(got, dt)
            else:
                self.assertIsInstance(got, torch.Tensor)
                self.assertEqual(got.dtype, TORCH_DT[dt])
            self.assertEqual(tuple(got.shape), tuple(ref.shape), name)
            err = cgtest.rel_err(got, ref)
            self.assertLess(err, cgtest.TOLERANCE[dt], "%s %s %s %s" % (
                case[0], dt, "transposed" if transposed else "conv", name))

    def test_every_op_dtype_and_case(self):
        for case in CASES:
            for dt in ("f32", "bf16", "f16"):
                for transposed in (False, True):
                    with self.subTest(case=case[0], dt=dt,
                                      transposed=transposed):
                        self.run_case(case, dt, transposed,
                                      numpy_arrays=(case[0] == "2d"))

    def test_layer_ops(self):
        # conv_backward / conv_transpose_backward: every output from one
        # call, against autograd (diff_bias: diff_dst summed over N and
        # space); a subset into out= arrays, as a first layer asks.
        for case in CASES:
            for dt in ("f32", "bf16"):
                for transposed in (False, True):
                    with self.subTest(case=case[0], dt=dt,
                                      transposed=transposed):
                        x, w, dy, dx_ref, dw_ref = reference(
                            case, transposed, TORCH_DT[dt], 5)
                        a = attrs_of(case, transposed)
                        fn = (self.c.conv_transpose_backward if transposed
                              else self.c.conv_backward)
                        got = fn(x, dy, w, **a)
                        self.assertEqual(set(got), {"diff_src", "diff_weights",
                                                    "diff_bias"})
                        db_ref = dy.double().sum(
                            dim=[0] + list(range(2, dy.dim())))
                        for name, ref in (("diff_src", dx_ref),
                                          ("diff_weights", dw_ref),
                                          ("diff_bias", db_ref)):
                            self.assertEqual(got[name].dtype, TORCH_DT[dt])
                            self.assertLess(cgtest.rel_err(got[name], ref),
                                            cgtest.TOLERANCE[dt], name)
                        out = {"diff_weights": torch.empty_like(w),
                               "diff_bias": torch.empty(db_ref.shape,
                                                        dtype=TORCH_DT[dt])}
                        r = fn(x, dy, w, outputs=["diff_bias", "diff_weights"],
                               out=out, **a)
                        self.assertIs(r, out)
                        self.assertLess(cgtest.rel_err(out["diff_weights"],
                                                       dw_ref),
                                        cgtest.TOLERANCE[dt])
        with self.assertRaises(convgrad.InvalidArgument):
            self.c.conv_backward(x, dy, w, outputs=["diff_dst"])

    def test_layer_ops_async(self):
        # Futures: several calls in flight from this thread, diff_src
        # collected as soon as it is in, then the rest; outputs allocated
        # by shape (diff_bias's length from each weights format) or given.
        futures = []
        for case in CASES:
            for transposed in (False, True):
                x, w, dy, dx_ref, dw_ref = reference(case, transposed,
                                                     torch.float32, 9)
                fn = (self.c.conv_transpose_backward_async if transposed
                      else self.c.conv_backward_async)
                f = fn(x, dy, w, with_result=True,
                       **attrs_of(case, transposed))
                db_ref = dy.double().sum(dim=[0] + list(range(2, dy.dim())))
                futures.append((f, dx_ref, dw_ref, db_ref))
        for f, dx_ref, _, _ in futures:
            self.assertLess(cgtest.rel_err(f.output("diff_src"), dx_ref),
                            2e-5)
        # Many in flight run on libcgclient's engine: not a thread each.
        x, w, dy, dx0_ref, _ = reference(CASES[0], False, torch.float32, 9)
        threads = len(os.listdir("/proc/self/task"))
        many = [self.c.conv_backward_async(x, dy, w,
                                           **attrs_of(CASES[0], False))
                for _ in range(48)]
        self.assertLessEqual(len(os.listdir("/proc/self/task")),
                             threads + 8)
        for g in many:
            self.assertLess(cgtest.rel_err(g.result()["diff_src"], dx0_ref),
                            2e-5)
        for f, dx_ref, dw_ref, db_ref in futures:
            got, res = f.result()
            self.assertTrue(f.done())
            self.assertEqual(res.attempts, 1)
            for name, ref in (("diff_src", dx_ref), ("diff_weights", dw_ref),
                              ("diff_bias", db_ref)):
                self.assertLess(cgtest.rel_err(got[name], ref), 2e-5, name)
        # numpy, NXC/XIO defaults, one output into a given array
        case = CASES[1]
        x, w, dy, dx_ref, dw_ref = reference(case, False, torch.float32, 4)
        to_nxc = (0, 2, 3, 1)
        xa = np.ascontiguousarray(x.permute(*to_nxc).numpy())
        dya = np.ascontiguousarray(dy.permute(*to_nxc).numpy())
        wa = np.ascontiguousarray(w.permute(2, 3, 1, 0).numpy())
        out = {"diff_weights": np.empty_like(wa)}
        a = attrs_of(case, False)
        del a["data_format"], a["weights_format"]
        f = self.c.conv_backward_async(xa, dya, wa, outputs="diff_weights",
                                       out=out, **a)
        self.assertIs(f.result(), out)
        self.assertLess(cgtest.rel_err(torch.from_numpy(
            out["diff_weights"]).permute(3, 2, 0, 1), dw_ref), 2e-5)
        with self.assertRaises(convgrad.InvalidArgument):
            f.output("diff_src")
        bad = self.c.conv_backward_async(
            x, dy, w, **attrs_of(case, False, strides=[0, 1]))
        with self.assertRaises(convgrad.InvalidArgument):
            bad.output("diff_src")
        with self.assertRaises(convgrad.InvalidArgument):
            bad.result()

    def test_nxc_defaults(self):
        # The spec's defaults: NXC data and XIO weights.
        case = CASES[1]
        x, w, dy, dx_ref, dw_ref = reference(case, False, torch.float32, 7)
        a = attrs_of(case, False)
        del a["data_format"], a["weights_format"]
        nxc = lambda t: t.permute(0, 2, 3, 1)  # noqa: E731
        xio = w.permute(2, 3, 1, 0)
        dx = self.c.conv_backward_data(nxc(dy), xio,
                                       dst_shape=list(nxc(x).shape), **a)
        dw = self.c.conv_backward_weights(nxc(x), nxc(dy),
                                          weights_shape=list(xio.shape), **a)
        self.assertLess(cgtest.rel_err(dx, nxc(dx_ref)), 2e-5)
        self.assertLess(cgtest.rel_err(dw, dw_ref.permute(2, 3, 1, 0)), 2e-5)

    def test_out_reuse(self):
        case = CASES[2]
        for dt in ("f32", "bf16"):
            out_t = torch.full((8, 2, 3, 3), 7.0, dtype=TORCH_DT[dt])
            out_n = to_numpy(torch.full((1, 8, 10, 10), 7.0,
                                        dtype=TORCH_DT[dt]))
            for seed in (1, 2):
                x, w, dy, dx_ref, dw_ref = reference(case, False,
                                                     TORCH_DT[dt], seed)
                a = attrs_of(case, False)
                r = self.c.conv_backward_weights(x, dy, out=out_t,
                                                 weights_shape=list(w.shape),
                                                 **a)
                self.assertIs(r, out_t)
                self.assertLess(cgtest.rel_err(out_t, dw_ref),
                                cgtest.TOLERANCE[dt])
                r, res = self.c.conv_backward_data(
                    to_numpy(dy), to_numpy(w), out=out_n,
                    dst_shape=list(x.shape), with_result=True, **a)
                self.assertIs(r, out_n)
                self.assertLess(cgtest.rel_err(from_numpy(out_n, dt), dx_ref),
                                cgtest.TOLERANCE[dt])
                self.assertEqual(res.bytes_received, out_n.nbytes)
                self.assertEqual(res.pads_begin, [2, 2])

    def test_result_is_library_memory(self):
        # Without out= the result is returned over the memory libcgclient
        # received it in, not a copy.
        case = CASES[0]
        x, w, dy, dx_ref, _ = reference(case, False, torch.float32, 3)
        dx = self.c.conv_backward_data(to_numpy(dy), to_numpy(w),
                                       dst_shape=list(x.shape),
                                       **attrs_of(case, False))
        import ctypes
        base = dx
        while isinstance(base, np.ndarray):
            base = base.base
        self.assertIsInstance(base, ctypes.Array)
        self.assertEqual(dx.ctypes.data % 64, 0)
        del dx

    def test_non_contiguous_inputs(self):
        case = CASES[1]
        x, w, dy, _, dw_ref = reference(case, False, torch.float32, 5)
        xt = x.transpose(2, 3).contiguous().transpose(2, 3)
        self.assertFalse(xt.is_contiguous())
        dw = self.c.conv_backward_weights(xt, dy, weights_shape=list(w.shape),
                                          **attrs_of(case, False))
        self.assertLess(cgtest.rel_err(dw, dw_ref), 2e-5)
        xn = np.asfortranarray(x.numpy())
        dw = self.c.conv_backward_weights(xn, dy.numpy(),
                                          weights_shape=list(w.shape),
                                          **attrs_of(case, False))
        self.assertLess(cgtest.rel_err(dw, dw_ref), 2e-5)

    def test_threads(self):
        case = CASES[2]
        x, w, dy, dx_ref, dw_ref = reference(case, False, torch.float32, 9)
        a = attrs_of(case, False)
        before = self.c.stats()["calls"]
        errors = []

        def work():
            try:
                for _ in range(10):
                    dx = self.c.conv_backward_data(dy, w,
                                                   dst_shape=list(x.shape),
                                                   **a)
                    dw = self.c.conv_backward_weights(
                        x, dy, weights_shape=list(w.shape), **a)
                    assert cgtest.rel_err(dx, dx_ref) < 2e-5
                    assert cgtest.rel_err(dw, dw_ref) < 2e-5
            except Exception as e:  # reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(self.c.stats()["calls"] - before, 160)

    def test_health_and_info(self):
        self.assertEqual(self.c.health(), "SERVING")
        info = self.c.info()
        self.assertEqual(info["workers"], 2)
        # The field after io_cpus: a layout out of step with client.h
        # reads something else here.
        self.assertEqual(info["threads_policy"], "static")  # --workers 2
        self.assertGreater(info["max_request_flops"], 0)
        # The last fields before the library's own: the service limits.
        self.assertEqual(info["max_stride"], 4096)
        self.assertEqual(info["max_padded_extent"], 1 << 24)
        self.assertEqual([o["names"][0] for o in info["ops"]],
                         ["ConvolutionBackwardData",
                          "ConvolutionBackwardWeights",
                          "ConvTransposeBackwardData",
                          "ConvTransposeBackwardWeights",
                          "ConvolutionBackward", "ConvTransposeBackward"])
        self.assertEqual(set(info["dtypes"]) & {"f32", "bf16", "f16"},
                         {"f32", "bf16", "f16"})
        self.assertEqual(self.c.target, SERVER.target)


class Regions(unittest.TestCase):
    # The server is on loopback, so it serves regions (--shm local).
    def test_tensors_in_a_region(self):
        with convgrad.Client(SERVER.target, deadline=30) as c:
            self.assertEqual(c.info()["shm"], "local")
            r = convgrad.Region(1 << 20)
            self.assertTrue(r.key.startswith("/convgrad-"))
            r.register(c)
            for dt in ("f32", "bf16"):
                case = CASES[2]  # strided, dilated, grouped
                x, w, dy, dx_ref, dw_ref = reference(case, False,
                                                     TORCH_DT[dt], 11)
                a = attrs_of(case, False)
                # One element in: element-aligned, not 8-byte aligned.
                at = [4 if dt == "f32" else 2]

                def place(t):
                    out = r.tensor(tuple(t.shape), TORCH_DT[dt], at[0])
                    out.copy_(t)
                    at[0] += out.numel() * out.element_size() + 64
                    return out
                xs, ws, dys = place(x), place(w), place(dy)
                dx, dw = place(dx_ref.to(TORCH_DT[dt])), place(
                    dw_ref.to(TORCH_DT[dt]))
                dx.zero_()
                dw.zero_()
                got, res = c.conv_backward_data(
                    dys, ws, dst_shape=list(x.shape), out=dx,
                    with_result=True, **a)
                self.assertIs(got, dx)
                self.assertEqual((res.bytes_sent, res.bytes_received), (0, 0))
                self.assertLess(cgtest.rel_err(dx, dx_ref),
                                cgtest.TOLERANCE[dt])
                c.conv_backward_weights(xs, dys, weights_shape=list(w.shape),
                                        out=dw, **a)
                self.assertLess(cgtest.rel_err(dw, dw_ref),
                                cgtest.TOLERANCE[dt])
            # numpy arrays in the region, the layer op's outputs streamed
            # back while its inputs stay put.
            case = CASES[0]
            x, w, dy, dx_ref, dw_ref = reference(case, True, torch.float32, 3)
            xa = r.array(tuple(x.shape), np.float32, 0)
            wa = r.array(tuple(w.shape), np.float32, 4096)
            dya = r.array(tuple(dy.shape), np.float32, 8192)
            xa[...], wa[...], dya[...] = x.numpy(), w.numpy(), dy.numpy()
            before = c.stats()["bytes_sent"]
            got = c.conv_transpose_backward(xa, dya, wa,
                                            **attrs_of(case, True))
            self.assertEqual(c.stats()["bytes_sent"], before)
            self.assertLess(cgtest.rel_err(torch.from_numpy(
                got["diff_weights"]), dw_ref), cgtest.TOLERANCE["f32"])
            with self.assertRaises(convgrad.InvalidArgument):
                r.array((4,), np.float32, offset=2)
            with self.assertRaises(convgrad.InvalidArgument):
                r.array((1 << 20,), np.float32)
            # Unregistered, the same arrays travel as bytes.
            r.unregister()
            got = c.conv_transpose_backward(xa, dya, wa,
                                            **attrs_of(case, True))
            self.assertEqual(c.stats()["bytes_sent"] - before,
                             xa.nbytes + wa.nbytes + dya.nbytes)
            with self.assertRaises(convgrad.FailedPrecondition):
                r.unregister()
            key = r.key
            del r, xa, wa, dya, xs, ws, dys, dx, dw, got
            self.assertFalse(os.path.exists("/dev/shm" + key))


def region_child(then, sweep="1"):
    """A Python process that makes a Region of a fresh name, prints its key
    and then runs then (source text, with r the Region)."""
    env = dict(os.environ, CONVGRAD_SHM_SWEEP=sweep,
               PYTHONPATH=os.path.join(cgtest.HERE, "..", "..", "client",
                                       "python"))
    code = ("import os, signal, sys, convgrad\n"
            "r = convgrad.Region(4096)\n"
            "print(r.key, flush=True)\n" + then)
    return subprocess.Popen([sys.executable, "-c", code], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


class Sweep(unittest.TestCase):
    """A process killed before it frees its regions (SIGKILL, the OOM
    killer) leaves their objects in /dev/shm; the next process of the same
    user and pid namespace to make a region of a fresh name removes them,
    and nothing of a live process, another user, another namespace or an
    older name."""

    def test_dead_processes_regions_are_removed(self):
        ns = os.stat("/proc/self/ns/pid").st_ino
        killed = region_child("os.kill(os.getpid(), signal.SIGKILL)\n")
        dead_key = killed.stdout.readline().strip()
        killed.communicate()
        self.assertRegex(dead_key, r"^/convgrad-%d-%d-\d+-[0-9a-f]{8}$" %
                         (killed.pid, ns))
        self.assertTrue(os.path.exists("/dev/shm" + dead_key))
        live = region_child("sys.stdin.readline()\n", "0")
        live_key = live.stdout.readline().strip()
        # Names the sweep must not judge: another namespace's pid, the
        # older name without a namespace, another user's object.
        forged = ["convgrad-%d-%d-1-0000abcd" % (killed.pid, ns + 1),
                  "convgrad-%d-7-0000abcd" % killed.pid]
        if os.geteuid() == 0:
            forged.append("convgrad-%d-%d-2-0000abcd" % (killed.pid, ns))
        try:
            for name in forged:
                with open("/dev/shm/" + name, "w"):
                    pass
            if os.geteuid() == 0:
                os.chown("/dev/shm/" + forged[2], 65534, 65534)
            # CONVGRAD_SHM_SWEEP=0: no sweep.
            region_child("", "0").communicate()
            self.assertTrue(os.path.exists("/dev/shm" + dead_key))
            sweeper = region_child("")
            sweeper.communicate()
            self.assertEqual(sweeper.returncode, 0)
            self.assertFalse(os.path.exists("/dev/shm" + dead_key))
            self.assertTrue(os.path.exists("/dev/shm" + live_key))
            for name in forged:
                self.assertTrue(os.path.exists("/dev/shm/" + name), name)
        finally:
            for name in forged + [dead_key[1:]]:
                if os.path.exists("/dev/shm/" + name):
                    os.unlink("/dev/shm/" + name)
            live.communicate("\n")
        self.assertFalse(os.path.exists("/dev/shm" + live_key))


class Arena(unittest.TestCase):
    def test_shm_true_stages_through_the_arena(self):
        # shm=True: inputs copied into the client's regions, a layer op's
        # outputs returned over them; nothing on the wire, same results;
        # closing the client removes the objects, arrays stay valid.
        case = CASES[2]
        x, w, dy, dx_ref, dw_ref = reference(case, False, torch.float32, 12)
        a = attrs_of(case, False)
        with convgrad.Client(SERVER.target, shm=True, shm_bytes=64 << 20) as c:
            got, res = c.conv_backward(x, dy, w, with_result=True, **a)
            self.assertEqual((res.bytes_sent, res.bytes_received), (0, 0))
            self.assertTrue(0 < c.stats()["arena_bytes"] <= 64 << 20)
            dx, res = c.conv_backward_data(dy, w, dst_shape=list(x.shape),
                                           with_result=True, **a)
            self.assertEqual(res.bytes_sent, 0)
            self.assertEqual(res.bytes_received, dx.numel() * 4)
        self.assertFalse([n for n in os.listdir("/dev/shm")
                          if n.startswith("convgrad-%d-" % os.getpid())])
        self.assertLess(cgtest.rel_err(got["diff_src"], dx_ref), 2e-5)
        self.assertLess(cgtest.rel_err(got["diff_weights"], dw_ref), 2e-5)
        self.assertLess(cgtest.rel_err(dx, dx_ref), 2e-5)
        with self.assertRaises(convgrad.InvalidArgument):
            convgrad.Client(SERVER.target, shm="yes")


class Errors(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = convgrad.Client(SERVER.target, deadline=30)
        cls.dy = np.ones((1, 2, 4, 4), np.float32)
        cls.w = np.ones((2, 2, 1, 1), np.float32)
        cls.a = dict(data_format="NCX", weights_format="OIX")

    def check(self, cls, code, fragment, fn, *args, **kw):
        with self.assertRaises(cls) as cm:
            fn(*args, **kw)
        e = cm.exception
        self.assertIsInstance(e, convgrad.Error)
        self.assertEqual(e.code, code)
        self.assertIn(fragment, e.message)
        self.assertIn(fragment, str(e))
        return e

    def test_server_invalid_argument(self):
        e = self.check(convgrad.InvalidArgument, 3, "strides[0]",
                       self.c.conv_backward_data, self.dy, self.w,
                       strides=[0, 1], **self.a)
        self.assertEqual(e.errno, -20)  # CGC_ERPC: the server's status
        self.assertEqual(e.code_name, "INVALID_ARGUMENT")
        self.check(convgrad.InvalidArgument, 3, "weights_shape",
                   self.c.conv_backward_weights, self.dy, self.dy, **self.a)

    def test_local_invalid_argument(self):
        self.check(convgrad.InvalidArgument, 3, "one dtype",
                   self.c.conv_backward_data, self.dy,
                   self.w.astype(np.float16), **self.a)
        self.check(convgrad.InvalidArgument, 3, "float64",
                   self.c.conv_backward_data, self.dy.astype(np.float64),
                   self.w, **self.a)
        self.check(convgrad.InvalidArgument, 3, "list",
                   self.c.conv_backward_data, [1.0], self.w, **self.a)
        self.check(convgrad.InvalidArgument, 3, "data_format",
                   self.c.conv_backward_data, self.dy, self.w,
                   data_format="NCHW")
        out = np.zeros((1, 4, 4, 2), np.float32).transpose(0, 3, 1, 2)
        self.check(convgrad.InvalidArgument, 3, "out: must be C-contiguous",
                   self.c.conv_backward_data, self.dy, self.w, out=out,
                   **self.a)
        self.check(convgrad.InvalidArgument, 3, "out: shape",
                   self.c.conv_backward_data, self.dy, self.w,
                   out=np.zeros((1, 2, 16), np.float32), **self.a)
        # a layer op's out=, called and started: exactly the outputs
        # asked for, each of the inputs' dtype
        for fn in (self.c.conv_backward, self.c.conv_backward_async):
            self.check(convgrad.InvalidArgument, 3, "out: a dict with "
                       "exactly the outputs asked for (diff_weights)",
                       fn, self.dy, self.dy, self.w, outputs=["diff_weights"],
                       out={"diff_src": np.zeros_like(self.dy)}, **self.a)
            self.check(convgrad.InvalidArgument, 3,
                       "out['diff_weights']: f16 but the inputs are f32",
                       fn, self.dy, self.dy, self.w, outputs=["diff_weights"],
                       out={"diff_weights": self.w.astype(np.float16)},
                       **self.a)
        with self.assertRaises(TypeError):
            self.c.conv_backward_data(self.dy, self.w, stride=[1, 1])
        self.check(convgrad.InvalidArgument, 3, "target",
                   convgrad.Client, "no port")

    def test_out_too_small(self):
        self.check(convgrad.ResourceExhausted, 8, "",
                   self.c.conv_backward_data, self.dy, self.w,
                   out=np.zeros((1, 2, 4, 3), np.float32), **self.a)

    def test_unavailable(self):
        with convgrad.Client(SERVER.target.rsplit(":", 1)[0] + ":1",
                             deadline=5, retries=1) as c:
            self.check(convgrad.Unavailable, 14, "", c.health)

    def test_retry_later(self):
        """A "retry later" refusal (RESOURCE_EXHAUSTED with the trailer
        retry-after-ms) is retried by libcgclient; one without the trailer
        is a limit and raises at once. tests/client/fake_server.py plays the
        server, its scenario named by the token."""
        fake = cgtest.Server(os.path.join(cgtest.HERE, "..", "client",
                                          "fake_server.py"))
        try:
            a = np.zeros((1, 1, 2, 2), np.float32)
            with convgrad.Client(fake.target, token="busy-once-10") as c:
                out, res = c.conv_backward_data(a, a, with_result=True)
                self.assertEqual((c.stats()["calls"], c.stats()["retries"]),
                                 (1, 1))
            self.assertEqual((res.attempts, res.worker), (2, "attempt=1"))
            np.testing.assert_array_equal(out.view(np.uint8).ravel(),
                                          np.arange(16))
            with convgrad.Client(fake.target, token="limit") as c:
                e = self.check(convgrad.ResourceExhausted, 8, "size limit",
                               c.conv_backward_data, a, a)
            self.assertEqual(e.errno, -20)
        finally:
            fake.proc.kill()
            fake.proc.wait()
            fake.proc.stdout.close()

    def test_future_timeout(self):
        # A Future whose answer takes 300 ms (the fake server): a short
        # wait raises TimeoutError and the call goes on to its answer.
        fake = cgtest.Server(os.path.join(cgtest.HERE, "..", "client",
                                          "fake_server.py"))
        try:
            a = np.zeros((1, 1, 2, 2), np.float32)
            out = {"diff_src": np.zeros(4, np.float32)}
            with convgrad.Client(fake.target, token="slow-300") as c:
                f = c.conv_backward_async(a, a, a, outputs="diff_src",
                                          out=out)
                with self.assertRaises(TimeoutError):
                    f.result(timeout=0.02)
                self.assertFalse(f.done())
                with self.assertRaises(convgrad.InvalidArgument):
                    f.result()  # the fake's 2x2 is not out's shape (4,)
        finally:
            fake.proc.kill()
            fake.proc.wait()
            fake.proc.stdout.close()

    def test_not_found(self):
        self.check(convgrad.NotFound, 5, "", self.c.health, "no.such.Service")

    def test_deadline(self):
        x = torch.randn(8, 64, 64, 64)
        w = torch.randn(64, 64, 3, 3)
        self.check(convgrad.DeadlineExceeded, 4, "",
                   self.c.conv_backward_weights, x, x, deadline=0.001,
                   weights_shape=list(w.shape), pads_begin=[1, 1],
                   pads_end=[1, 1], **self.a)

    def test_closed(self):
        c = convgrad.Client(SERVER.target)
        c.close()
        self.check(convgrad.Error, 9, "closed", c.health)

    def test_missing_library(self):
        env = dict(os.environ, CONVGRAD_LIBRARY="/nonexistent/libcgclient.so")
        r = subprocess.run([sys.executable, "-c",
                            "import cgtest, convgrad"],
                           cwd=cgtest.HERE, env=env, capture_output=True,
                           text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("ImportError: CONVGRAD_LIBRARY=/nonexistent/"
                      "libcgclient.so cannot be loaded", r.stderr)

    def test_library_of_another_abi(self):
        """A library without cgc_version (as before 0.2: here libcgcore,
        beside libcgclient in the build) is refused, not read with the
        wrong structure layouts; the one ctest names reports the
        package's own version."""
        from convgrad import _lib
        lib = os.environ["CONVGRAD_LIBRARY"]
        self.assertEqual(_lib.load().cgc_version().decode().rsplit(".", 1)[0],
                         _lib.SONAME.split(".so.", 1)[1])
        core = os.path.join(os.path.dirname(os.path.dirname(lib)), "kernels",
                            "libcgcore.so")
        env = dict(os.environ, CONVGRAD_LIBRARY=core)
        r = subprocess.run([sys.executable, "-c", "import cgtest, convgrad"],
                           cwd=cgtest.HERE, env=env, capture_output=True,
                           text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("ImportError: %s is libcgclient older than 0.2; this "
                      "convgrad package needs" % core, r.stderr)


class TLS(unittest.TestCase):
    """The package's TLS keywords against a mutual-TLS server, with
    certificates made by openssl (test_server_tls.py's make_certs)."""

    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, os.path.join(cgtest.HERE, "..", "server"))
        from test_server_tls import make_certs
        cls.dir = tempfile.mkdtemp(prefix="cgpy-tls-")
        f = make_certs(cls.dir)
        cls.f = staticmethod(f)
        cls.server = cgtest.Server(ARGS.server, [
            "--tls-cert", f("server.pem"), "--tls-key", f("server.key"),
            "--tls-client-ca", f("ca.pem")])
        cls.tls = dict(tls_ca=f("ca.pem"), tls_server_name="convgrad.test")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.dir)

    def test_mutual_tls(self):
        f = self.f
        with convgrad.Client(self.server.target, deadline=30,
                             tls_cert=f("client.pem"), tls_key=f("client.key"),
                             **self.tls) as c:
            self.assertEqual(c.health(), "SERVING")
            dy = torch.randn(2, 4, 6, 6)
            w = torch.randn(4, 3, 3, 3)
            a = dict(data_format="NCX", weights_format="OIX",
                     pads_begin=[1, 1], pads_end=[1, 1])
            dx = c.conv_backward_data(dy, w, dst_shape=[2, 3, 6, 6], **a)
            ref = torch.nn.grad.conv2d_input([2, 3, 6, 6], w, dy, padding=1)
            self.assertLess(cgtest.rel_err(dx, ref), 2e-5)

    def test_refused(self):
        with convgrad.Client(self.server.target, deadline=5, retries=0,
                             **self.tls) as c:  # no client certificate
            with self.assertRaises(convgrad.Unavailable):
                c.health()
        with self.assertRaises(convgrad.InvalidArgument) as cm:
            convgrad.Client(self.server.target, tls_ca=self.f("none.pem"))
        self.assertIn("tls_ca_file", cm.exception.message)
        with self.assertRaises(convgrad.InvalidArgument) as cm:
            convgrad.Client(self.server.target, tls_ca=self.f("ca.pem"),
                            tls_cert=self.f("client.pem"),
                            tls_key=self.f("lone.key"))
        self.assertIn("does not match", cm.exception.message)


class Replicas(unittest.TestCase):
    """Client(replicas=2) over two servers: a layer call split into parts
    (cgc_options.replicas through the ctypes struct) equals the unsplit
    call, and a replica count the target cannot have is refused."""

    def test_split_layer_call(self):
        other = cgtest.Server(ARGS.server)
        try:
            pair = SERVER.target + "," + other.target
            rng = np.random.default_rng(4)
            x = rng.standard_normal((8, 8, 12, 12), dtype=np.float32)
            dy = rng.standard_normal((8, 16, 12, 12), dtype=np.float32)
            w = rng.standard_normal((16, 8, 3, 3), dtype=np.float32)
            a = dict(data_format="NCX", weights_format="OIX",
                     pads_begin=[1, 1], pads_end=[1, 1])
            with convgrad.Client(SERVER.target) as one, \
                    convgrad.Client(pair, replicas=2, split_parts=4,
                                    split_min_flops=1000) as two:
                want = one.conv_backward(x, dy, w, **a)
                got, res = two.conv_backward(x, dy, w, with_result=True, **a)
            self.assertEqual(res.worker, "4 parts")
            for g in want:
                self.assertEqual(got[g].shape, want[g].shape, g)
                self.assertLess(cgtest.rel_err(got[g],
                                               torch.from_numpy(want[g])),
                                cgtest.TOLERANCE["f32"], g)
            with self.assertRaises(convgrad.InvalidArgument) as cm:
                convgrad.Client(pair, replicas=3)
            self.assertIn("replicas: 3, but the target lists 2",
                          cm.exception.message)
        finally:
            other.stop()


class Verify(unittest.TestCase):
    """Client(verify_rate=1): the client checks every result itself
    (libcgclient's cgc_options.verify_rate), blocking and asynchronous;
    right results pass, stats() counts them; CONVGRAD_VERIFY_RATE is the
    default; a rate outside [0, 1] is refused."""

    def test_verify_rate(self):
        case = CASES[0]
        x, w, dy, dx_ref, dw_ref = reference(case, False, torch.float32, 3)
        a = attrs_of(case, False)
        with convgrad.Client(SERVER.target, verify_rate=1) as c:
            got = c.conv_backward(x, dy, w, **a)
            fut = c.conv_backward_async(x, dy, w, **a).result()
            s = c.stats()
        for r in (got, fut):
            self.assertLess(cgtest.rel_err(r["diff_src"], dx_ref),
                            cgtest.TOLERANCE["f32"])
            self.assertLess(cgtest.rel_err(r["diff_weights"], dw_ref),
                            cgtest.TOLERANCE["f32"])
        self.assertEqual((s["verify_calls"], s["verify_outputs"],
                          s["verify_failed"], s["verify_lost"]), (2, 6, 0, 0))
        os.environ["CONVGRAD_VERIFY_RATE"] = "1"
        try:
            with convgrad.Client(SERVER.target) as c:
                c.conv_backward(x, dy, w, outputs="diff_src", **a)
                self.assertEqual(c.stats()["verify_outputs"], 1)
            os.environ["CONVGRAD_VERIFY_RATE"] = "often"
            with self.assertRaises(convgrad.InvalidArgument) as cm:
                convgrad.Client(SERVER.target)
            self.assertIn("CONVGRAD_VERIFY_RATE", cm.exception.message)
        finally:
            del os.environ["CONVGRAD_VERIFY_RATE"]
        with self.assertRaises(convgrad.InvalidArgument) as cm:
            convgrad.Client(SERVER.target, verify_rate=2)
        self.assertIn("verify_rate", cm.exception.message)


def main():
    global ARGS, SERVER
    ARGS = cgtest.parse_args(__doc__)
    SERVER = cgtest.Server(ARGS.server)
    try:
        prog = unittest.main(argv=[sys.argv[0], "-v"], exit=False)
    finally:
        SERVER.stop()
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
