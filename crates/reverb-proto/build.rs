//! Compiles `proto/` with protox (a pure-Rust protoc), so building needs no system protoc.
use prost::Message;
use std::path::PathBuf;

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files = [
        "reverb/reverb_service.proto",
        "reverb/checkpoint.proto",
        "reverb/patterns.proto",
        "reverb/reverb_config.proto",
    ];
    println!("cargo:rerun-if-changed={}", root.display());
    let fds = protox::compile(files, [&root]).expect("compiling proto/ failed");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    // Python builds its message classes from this descriptor set (reverb/_proto.py).
    std::fs::write(out.join("descriptor_set.bin"), fds.encode_to_vec()).unwrap();
    tonic_prost_build::configure()
        .bytes(".")
        // Pre-sizes each encoded message (see src/codec.rs).
        .codec_path("crate::codec::ReverbCodec")
        // Written by hand, with its items kept encoded (see src/encoded.rs).
        .extern_path(
            ".deepmind.reverb.InsertStreamRequest",
            "crate::encoded::InsertStreamRequest",
        )
        // Messages build without tonic; the stubs only with the `service` feature.
        .client_mod_attribute(".", "#[cfg(feature = \"service\")]")
        .server_mod_attribute(".", "#[cfg(feature = \"service\")]")
        .compile_fds(fds)
        .expect("generating Rust code from proto/ failed");
}
