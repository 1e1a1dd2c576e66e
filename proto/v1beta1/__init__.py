"""Device plugin API v1beta1.

``api_pb2`` holds the messages, ``api_pb2_grpc`` the services; both are
generated from ``api.proto`` by ``make proto`` and checked in.
"""
