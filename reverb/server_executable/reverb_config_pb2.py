"""`ReverbServerConfig` (`tables`, `port`), as in the reference's
`reverb.server_executable.reverb_config_pb2`."""

from reverb._proto import ReverbServerConfig  # noqa: F401
