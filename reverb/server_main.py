"""`reverb_server --config FILE`: a standalone Reverb server for any process manager.

The config is the reference's `ReverbServerConfig` in protobuf text format (the text itself,
as the reference's server takes it, or a `.textproto` / `.pbtxt` file), or JSON (or TOML on
Python >= 3.11, by file extension), which also configures checkpoints:

    {
      "port": 8000,
      "host": "10.0.0.5",                         # optional: listen on this address only
      "auth_token_file": "/etc/reverb/token",     # optional: serve only calls with this token
      "tls_cert": "/etc/reverb/server.pem",       # optional: serve TLS with this certificate
      "tls_key": "/etc/reverb/server.key",        #   and key (PEM files)
      "tls_client_ca": "/etc/reverb/ca.pem",      # optional: only clients it signed (mTLS)
      "metrics_port": 9090,                       # optional: Prometheus metrics at /metrics
      "log_stats_seconds": 60,                    # optional: one line per table this often
      "checkpoint_dir": "/var/lib/reverb",        # optional: restore on start, save on request
      "fallback_checkpoint_path": null,           # optional
      "keep_latest": 1,                           # optional
      "checkpoint_on_exit": false,                # optional: save when stopped by a signal
      "storage": {"directory": "/var/lib/reverb/data",     # optional: tables on disk
                  "cache_bytes": 4294967296,               #   behind a cache this big,
                  "sync_interval": 1.0},                   #   journal synced this often
                                                           #   (seconds, or "always")
      "tables": [
        {"name": "replay", "sampler": {"prioritized": 0.6}, "remover": "fifo",
         "max_size": 1000000, "max_times_sampled": 0,
         "rate_limiter": {"sample_to_insert_ratio": [4.0, 1000, 100.0]}},
        {"name": "queue", "queue": 1000}
      ]
    }

Selectors: "uniform", "fifo", "lifo", "min_heap", "max_heap", {"prioritized": exponent}.
Rate limiters: {"min_size": n}, {"sample_to_insert_ratio": [spi, min_size, error_buffer]}
(error_buffer may be a [min_diff, max_diff] pair), {"queue": size}, {"stack": size},
{"explicit": [samples_per_insert, min_size_to_sample, min_diff, max_diff]}.
Without "auth_token_file", the REVERB_AUTH_TOKEN environment variable (when set) is the token;
without "tls_cert", REVERB_TLS_CERT, REVERB_TLS_KEY and REVERB_TLS_CLIENT_CA name the files.
SIGTERM and SIGINT stop the server cleanly (exit status 0).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from typing import Any, Dict, List, Optional, Tuple

import reverb
from reverb import checkpointers, item_selectors, rate_limiters

log = logging.getLogger("reverb_server")

_SELECTORS = {
    "uniform": item_selectors.Uniform,
    "fifo": item_selectors.Fifo,
    "lifo": item_selectors.Lifo,
    "min_heap": item_selectors.MinHeap,
    "max_heap": item_selectors.MaxHeap,
}


class ConfigError(ValueError):
    """The config file is not valid; the message says where."""


def _selector(spec: Any, where: str) -> item_selectors.ItemSelector:
    if isinstance(spec, str) and spec in _SELECTORS:
        return _SELECTORS[spec]()
    if isinstance(spec, dict) and list(spec) == ["prioritized"]:
        return item_selectors.Prioritized(float(spec["prioritized"]))
    raise ConfigError(
        f"{where}: unknown selector {spec!r}; use one of {sorted(_SELECTORS)} or "
        '{"prioritized": exponent}'
    )


def _rate_limiter(spec: Any, where: str) -> rate_limiters.RateLimiter:
    if not isinstance(spec, dict) or len(spec) != 1:
        raise ConfigError(f"{where}: rate_limiter must be an object with one key, got {spec!r}")
    ((kind, value),) = spec.items()
    if kind == "min_size":
        return rate_limiters.MinSize(int(value))
    if kind == "sample_to_insert_ratio":
        spi, min_size, error_buffer = value
        buffer = tuple(error_buffer) if isinstance(error_buffer, list) else float(error_buffer)
        return rate_limiters.SampleToInsertRatio(float(spi), int(min_size), buffer)
    if kind == "queue":
        return rate_limiters.Queue(int(value))
    if kind == "stack":
        return rate_limiters.Stack(int(value))
    if kind == "explicit":
        spi, min_size, min_diff, max_diff = value
        return rate_limiters.RateLimiter(
            float(spi), int(min_size), float(min_diff), float(max_diff)
        )
    raise ConfigError(f"{where}: unknown rate limiter {kind!r}")


def tables_from_config(config: Dict[str, Any]) -> List[reverb.Table]:
    """Builds the tables a config describes; ConfigError names the faulty entry."""
    specs = config.get("tables")
    if not isinstance(specs, list) or not specs:
        raise ConfigError("config: 'tables' must be a non-empty list")
    tables = []
    for i, spec in enumerate(specs):
        where = f"tables[{i}]"
        if not isinstance(spec, dict) or "name" not in spec:
            raise ConfigError(f"{where}: each table needs a 'name'")
        where = f"tables[{i}] ({spec['name']})"
        try:
            if "queue" in spec:
                tables.append(reverb.Table.queue(spec["name"], int(spec["queue"])))
            elif "stack" in spec:
                tables.append(reverb.Table.stack(spec["name"], int(spec["stack"])))
            else:
                tables.append(
                    reverb.Table(
                        name=spec["name"],
                        sampler=_selector(spec.get("sampler", "uniform"), where),
                        remover=_selector(spec.get("remover", "fifo"), where),
                        max_size=int(spec["max_size"]),
                        rate_limiter=_rate_limiter(
                            spec.get("rate_limiter", {"min_size": 1}), where
                        ),
                        max_times_sampled=int(spec.get("max_times_sampled", 0)),
                    )
                )
        except ConfigError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"{where}: {e}") from None
    return tables


def load_config(path: str) -> Dict[str, Any]:
    """Reads a JSON (or, on Python >= 3.11, TOML) config file."""
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".toml"):
        import tomllib  # Python >= 3.11

        return tomllib.loads(data.decode())
    try:
        return json.loads(data)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON: {e}") from None


_TEXTPROTO_SUFFIXES = (".textproto", ".pbtxt", ".txtpb", ".prototxt")


def _textproto(arg: str) -> Optional[str]:
    """The config text if `arg` is (or names a file of) a textproto `ReverbServerConfig`."""
    if os.path.isfile(arg):
        if not arg.endswith(_TEXTPROTO_SUFFIXES):
            return None
        with open(arg) as f:
            return f.read()
    if arg.endswith((".json", ".toml") + _TEXTPROTO_SUFFIXES):
        return None  # a missing file: load_config says so
    return arg


def read_config(arg: str) -> Tuple[Dict[str, Any], List[reverb.Table]]:
    """The config `--config` names and its tables: a textproto `ReverbServerConfig` (text
    or file), or a JSON/TOML file."""
    text = _textproto(arg)
    if text is None:
        config = load_config(arg)
        return config, tables_from_config(config)
    from google.protobuf import text_format

    from reverb.server_executable import reverb_config_pb2, server_from_proto

    proto = reverb_config_pb2.ReverbServerConfig()
    try:
        text_format.Parse(text, proto)
    except text_format.ParseError as e:
        raise ConfigError(
            f"--config: not a ReverbServerConfig textproto (nor a file): {e}"
        ) from None
    if not proto.tables:
        raise ConfigError("--config: the ReverbServerConfig has no tables")
    try:
        tables = server_from_proto.tables_from_proto(proto.tables)
    except (NotImplementedError, ValueError) as e:
        raise ConfigError(f"--config: {e}") from None
    return {"port": proto.port or None}, tables


def _storage(spec: Any) -> Optional[reverb.DiskStorage]:
    """The config's "storage": a directory, or {"directory": ..., "cache_bytes": ...}."""
    if spec is None:
        return None
    if isinstance(spec, str):
        return reverb.DiskStorage(spec)
    if not isinstance(spec, dict) or "directory" not in spec:
        raise ValueError(
            f'"storage" must be a directory or {{"directory": ..., "cache_bytes": ...}}, '
            f"got {spec!r}"
        )
    unknown = sorted(set(spec) - {"directory", "cache_bytes", "sync_interval"})
    if unknown:
        raise ValueError(f'"storage" has unknown keys {unknown}')
    try:
        return reverb.DiskStorage(
            spec["directory"],
            cache_bytes=int(spec.get("cache_bytes", reverb.storage.DEFAULT_CACHE_BYTES)),
            sync_interval=spec.get("sync_interval", 1.0),
        )
    except TypeError as e:
        raise ValueError(f'"storage": {e}') from e


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="reverb_server", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config",
        required=True,
        help="ReverbServerConfig textproto (text or .textproto file), or JSON/TOML file",
    )
    parser.add_argument("--port", type=int, help="overrides the config's port")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        config, tables = read_config(args.config)
        checkpointer = None
        if config.get("checkpoint_dir"):
            checkpointer = checkpointers.DefaultCheckpointer(
                config["checkpoint_dir"],
                fallback_checkpoint_path=config.get("fallback_checkpoint_path"),
                keep_latest=int(config.get("keep_latest", 1)),
            )
        port = args.port if args.port is not None else config.get("port")
        auth_token = None
        if config.get("auth_token_file"):
            with open(config["auth_token_file"], encoding="utf-8") as f:
                auth_token = f.read().strip()
            if not auth_token:
                raise ValueError(f"auth_token_file {config['auth_token_file']} is empty")
        storage = _storage(config.get("storage"))
        server = reverb.Server(
            tables,
            port=port,
            storage=storage,
            checkpointer=checkpointer,
            host=config.get("host"),
            auth_token=auth_token,
            metrics_port=config.get("metrics_port"),
            log_stats_every=config.get("log_stats_seconds"),
            tls_cert=config.get("tls_cert"),
            tls_key=config.get("tls_key"),
            tls_client_ca=config.get("tls_client_ca"),
        )
    except (OSError, ValueError) as e:
        log.error("cannot start: %s", e)
        return 2

    def stop(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    # Everything from here on may be interrupted by SIGTERM / SIGINT (even while logging).
    try:
        for table in tables:
            info = table.info
            log.info(
                "table %r: %d items, max_size %d, sampler %s, remover %s",
                table.name,
                info.current_size,
                info.max_size,
                info.sampler_options.WhichOneof("distribution"),
                info.remover_options.WhichOneof("distribution"),
            )
        if checkpointer is not None:
            log.info("checkpoints in %s", checkpointer.path)
        if storage is not None:
            log.info(
                "chunk data on disk in %s (cache %d bytes)", storage.directory, storage.cache_bytes
            )
        log.info(
            "serving on port %d (%s%s%s)",
            server.port,
            config.get("host") or "every interface",
            ", TLS" if config.get("tls_cert") or os.environ.get("REVERB_TLS_CERT") else "",
            ", calls need the auth token"
            if auth_token or os.environ.get("REVERB_AUTH_TOKEN")
            else "",
        )
        if server.metrics_port is not None:
            log.info("metrics on port %d", server.metrics_port)
        server.wait()
    except KeyboardInterrupt as e:
        log.info("stopping (%s)", e or "SIGINT")
    # A second signal during shutdown must not abort the final checkpoint.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if config.get("checkpoint_on_exit") and checkpointer is not None:
        path = server.localhost_client().checkpoint(timeout=600)
        log.info("checkpoint written to %s", path)
    server.stop()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
