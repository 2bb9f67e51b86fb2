//! Links the kernel library against a stub `libtensorflow_framework.so.2` made from
//! `tf_symbols.txt`, so no TensorFlow is needed to build. The library records
//! `DT_NEEDED libtensorflow_framework.so.2`; at load time the dynamic loader matches that soname
//! with the TensorFlow already in the process. `--no-undefined` makes any TF_ function missing
//! from the allow-list a build error instead of a load-time "undefined symbol".

use std::env;
use std::fs;
use std::path::PathBuf;
use std::process::Command;

const SONAME: &str = "libtensorflow_framework.so.2";

fn main() {
    println!("cargo:rerun-if-changed=tf_symbols.txt");
    println!("cargo:rerun-if-changed=build.rs");
    if env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        panic!("reverb-tf-ops is built for Linux only");
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let symbols = fs::read_to_string("tf_symbols.txt").expect("tf_symbols.txt");
    let stub: String = symbols
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|s| format!("void {s}(void) {{}}\n"))
        .collect();
    let source = out.join("tf_stub.c");
    fs::write(&source, stub).expect("write tf_stub.c");
    let cc = env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(out.join(SONAME))
        .arg(format!("-Wl,-soname,{SONAME}"))
        .arg(&source)
        .status()
        .unwrap_or_else(|e| panic!("could not run the C compiler `{cc}`: {e}"));
    assert!(status.success(), "building the TensorFlow stub failed");
    println!("cargo:rustc-cdylib-link-arg=-L{}", out.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-cdylib-link-arg=-l:{SONAME}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--no-undefined");
}
