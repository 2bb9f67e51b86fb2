"""Protobuf modules at the reference's import paths (`reverb.cc.schema_pb2`)."""
