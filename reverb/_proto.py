"""Protobuf message classes of the wire protocol, built at import time from the descriptor
set compiled into the native module (no protoc needed). They live in a private descriptor
pool, so they never clash with TensorFlow's own registrations."""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from reverb import _native


def _files() -> list:
    """The compiled files, dependencies first. `PriorityTableCheckpoint.signature` becomes a
    `tensorflow.StructuredValue`, as the reference declares it (the native side keeps it as
    bytes; both encode alike), so textproto configs write a table's signature as a message."""
    files = {
        f.name: f
        for f in descriptor_pb2.FileDescriptorSet.FromString(_native.descriptor_set()).file
    }
    checkpoint = files["reverb/checkpoint.proto"]
    if "tensorflow/struct.proto" not in checkpoint.dependency:
        checkpoint.dependency.append("tensorflow/struct.proto")
    for message in checkpoint.message_type:
        for field in message.field:
            if (message.name, field.name) == ("PriorityTableCheckpoint", "signature"):
                field.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
                field.type_name = ".tensorflow.StructuredValue"
    ordered: list = []

    def add(name: str) -> None:
        if name not in ordered:
            for dependency in files[name].dependency:
                add(dependency)
            ordered.append(name)

    for name in files:
        add(name)
    return [files[name] for name in ordered]


_pool = descriptor_pool.DescriptorPool()
for _file in _files():
    _pool.Add(_file)


def _message(full_name: str) -> type:
    descriptor = _pool.FindMessageTypeByName(full_name)
    get_class = getattr(message_factory, "GetMessageClass", None)
    if get_class is not None:
        return get_class(descriptor)
    return message_factory.MessageFactory(_pool).GetPrototype(descriptor)  # protobuf < 4.22


KeyDistributionOptions = _message("deepmind.reverb.KeyDistributionOptions")
RateLimiterInfo = _message("deepmind.reverb.RateLimiterInfo")
TableWorkerTime = _message("deepmind.reverb.TableWorkerTime")
TableInfo = _message("deepmind.reverb.TableInfo")
PrioritizedItem = _message("deepmind.reverb.PrioritizedItem")
FlatTrajectory = _message("deepmind.reverb.FlatTrajectory")
ChunkData = _message("deepmind.reverb.ChunkData")
SampleInfo = _message("deepmind.reverb.SampleInfo")

# StructuredWriter configs (`reverb.cc.patterns_pb2`).
RateLimiterCheckpoint = _message("deepmind.reverb.RateLimiterCheckpoint")
PriorityTableCheckpoint = _message("deepmind.reverb.PriorityTableCheckpoint")
ReverbServerConfig = _message("deepmind.reverb.ReverbServerConfig")
PatternNode = _message("deepmind.reverb.PatternNode")
Condition = _message("deepmind.reverb.Condition")
Priority = _message("deepmind.reverb.Priority")
StructuredWriterConfig = _message("deepmind.reverb.StructuredWriterConfig")

# TensorFlow's structure messages (the subset in proto/tensorflow/struct.proto).
StructuredValue = _message("tensorflow.StructuredValue")
TensorSpecProto = _message("tensorflow.TensorSpecProto")
