//! Finds the in-process sampling function of the Python extension (`reverb._native`), which
//! holds the servers of this process, so datasets can sample them without gRPC (see
//! `reverb_client::transport::inproc::abi`).

use reverb_client::transport::inproc::abi::{Exported, SampleFn, SAMPLE_SYMBOL};
use std::ffi::CString;
use std::os::raw::{c_char, c_int, c_void};

extern "C" {
    fn dlopen(filename: *const c_char, flag: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
}

const RTLD_LAZY: c_int = 1;
const RTLD_NOLOAD: c_int = 4;

/// The server on `port` in this process, reached through the already-loaded `library`; `None`
/// (use gRPC) when there is none.
pub fn find(library: &str, port: i64) -> Option<Exported> {
    if library.is_empty() || !(1..=i64::from(u16::MAX)).contains(&port) {
        return None;
    }
    let path = CString::new(library).ok()?;
    // SAFETY: with RTLD_NOLOAD, dlopen only returns a handle to a library already loaded in
    // this process (it never loads one or runs initializers); a null result is handled.
    let handle = unsafe { dlopen(path.as_ptr(), RTLD_LAZY | RTLD_NOLOAD) };
    if handle.is_null() {
        return None;
    }
    // SAFETY: handle is live; the symbol name is NUL-terminated.
    let symbol = unsafe { dlsym(handle, SAMPLE_SYMBOL.as_ptr() as *const c_char) };
    if symbol.is_null() {
        return None;
    }
    // SAFETY: the extension defines this versioned symbol with exactly the `SampleFn`
    // signature (both sides use the type from reverb_client's `abi`).
    let sample = unsafe { std::mem::transmute::<*mut c_void, SampleFn>(symbol) };
    Some(Exported {
        sample,
        port: port as u16,
    })
}
