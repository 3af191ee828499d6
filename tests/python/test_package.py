#!/usr/bin/python3
"""test_package.py - the Python package as the build assembles and the
packages install it (BUILD/python: client/python's modules plus
convgrad.v1, generated from proto/): the ctypes client and the grpcio stubs
import in one interpreter, from the built package even with another
convgrad, one without convgrad.v1 (the source tree's), later on sys.path,
and both talk to a real server: GetServerInfo through convgrad_pb2_grpc and
through convgrad.Client report the same server, and a call through the stub
agrees with one through the client; the server's refusal of bytes that
do not hash to their id is the one convgrad.torch reads as a server
without private ids. Exits 77 (ctest skip) without grpcio.

Usage: test_package.py --server PATH, with CG_PYTHON_DIR (the built
package's parent) and CONVGRAD_LIBRARY set (ctest sets both)."""
import os
import sys

import cgtest  # puts the source tree's package on sys.path

import numpy as np

sys.path.insert(0, os.environ["CG_PYTHON_DIR"])


def main():
    args = cgtest.parse_args(__doc__)
    try:
        import grpc
    except ImportError:
        print("no python3-grpcio: skipped")
        sys.exit(77)
    import convgrad
    from convgrad.v1 import convgrad_pb2 as pb
    from convgrad.v1 import convgrad_pb2_grpc as pbg
    built = os.path.join(os.environ["CG_PYTHON_DIR"], "convgrad")
    assert os.path.dirname(convgrad.__file__) == built, convgrad.__file__
    assert os.path.dirname(os.path.dirname(pb.__file__)) == built, pb.__file__

    server = cgtest.Server(args.server)
    try:
        with convgrad.Client(server.target, deadline=30) as c:
            mine = c.info()
            stub = pbg.ConvGradStub(grpc.insecure_channel(server.target))
            theirs = stub.GetServerInfo(pb.ServerInfoRequest(), timeout=30)
            assert theirs.version == mine["version"], (theirs, mine)
            assert [list(o.names) for o in theirs.ops] == \
                [o["names"] for o in mine["ops"]]

            # One ConvolutionBackwardData both ways: a 1x1 kernel of ones
            # over one channel gives diff_src = diff_dst.
            dy = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
            w = np.ones((1, 1, 1, 1), np.float32)
            attrs = dict(data_format="NCX", weights_format="OIX")
            dx = c.conv_backward_data(dy, w, dst_shape=[1, 1, 4, 4], **attrs)
            header = pb.ComputeHeader(
                op=pb.CONVOLUTION_BACKWARD_DATA,
                attrs=pb.Attributes(data_format=pb.NCX,
                                    weights_format=pb.OIX,
                                    dst_shape=[1, 1, 4, 4]),
                inputs=[pb.Tensor(dtype=pb.F32, shape=[1, 1, 4, 4],
                                  data=dy.tobytes()),
                        pb.Tensor(dtype=pb.F32, shape=[1, 1, 1, 1],
                                  data=w.tobytes())])
            got = b"".join(
                m.header.data if m.HasField("header") else m.chunk
                for m in stub.Compute(iter([pb.ComputeRequest(header=header)]),
                                      timeout=30))
            stub_dx = np.frombuffer(got, np.float32).reshape(dx.shape)
            assert np.array_equal(stub_dx, dx) and np.array_equal(dx, dy), \
                (stub_dx, dx)

            # What an old server says of a private id (bytes that do not
            # hash to the id sent) is what convgrad.torch takes for "no
            # private ids here", and no other refusal of a Stage is.
            from convgrad.torch import _NO_PRIVATE_IDS

            def refusal(**h):
                try:
                    stub.Stage(iter([pb.StageRequest(
                        header=pb.StageHeader(**h))]), timeout=30)
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
                    return e.details()
                raise AssertionError("Stage %s was accepted" % h)
            said = refusal(sha256=bytes(32), byte_size=4, data=b"abcd")
            assert _NO_PRIVATE_IDS.match(said), said
            said = refusal(sha256=bytes(32), byte_size=0)
            assert not _NO_PRIVATE_IDS.match(said), said
    finally:
        server.stop()
    print("python_package: convgrad and convgrad.v1 from %s agree on "
          "server %s" % (built, theirs.version))


if __name__ == "__main__":
    main()
