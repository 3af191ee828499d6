"""convgrad.v1: the protobuf messages (convgrad_pb2) and grpcio stubs
(convgrad_pb2_grpc) of proto/convgrad/v1/convgrad.proto, generated with
protoc when convgrad was built, for callers that speak the wire protocol
themselves. They need python3-protobuf, and python3-grpcio for the stubs;
the rest of the package needs neither.

    import grpc
    from convgrad.v1 import convgrad_pb2, convgrad_pb2_grpc
    stub = convgrad_pb2_grpc.ConvGradStub(grpc.insecure_channel(target))
    info = stub.GetServerInfo(convgrad_pb2.ServerInfoRequest())
"""
