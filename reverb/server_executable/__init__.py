"""The standalone server's config, at the reference's import paths (`reverb_config_pb2`,
`server_from_proto`); the server itself is `reverb_server` (`reverb.server_main`)."""
