//! The client side of the shared-memory sample transport (see `reverb_proto::shm`): a ring in
//! a sealed `memfd` that a server on the same host writes chunk bytes into. Chunks taken from
//! the ring are `Bytes` that release their space when the last reference goes, in any order;
//! the ring reports the released prefix back to the server.

use bytes::Bytes;
use parking_lot::Mutex;
use reverb_proto::shm::{
    RingOffer, DATA_OFFSET, MAX_RING_BYTES, MEMFD_NAME, MIN_RING_BYTES, TOKEN_LEN,
};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Ring data bytes for a stream keeping `max_in_flight` samples requested: 256 KiB per
/// sample, from 4 to 64 MiB. Samples that do not fit come inline. (The server allocates the
/// pages when it first writes a chunk: streams of small chunks cost no memory.)
pub fn ring_bytes(max_in_flight: usize) -> usize {
    max_in_flight
        .saturating_mul(256 << 10)
        .clamp(4 << 20, 64 << 20)
}

/// Whether `address` (`host:port`, maybe with a scheme) names this host: only then is a ring
/// worth offering (the server checks again, by opening it).
pub fn is_this_host(address: &str) -> bool {
    let rest = address.split_once("://").map_or(address, |(_, r)| r);
    let host = rest.rsplit_once(':').map_or(rest, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return ip.is_loopback() || ip.is_unspecified();
    }
    let mut name = [0u8; 256];
    // SAFETY: writes at most `name.len()` bytes into `name`.
    let ok = unsafe { libc::gethostname(name.as_mut_ptr() as *mut libc::c_char, name.len()) };
    let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    ok == 0 && host.as_bytes().eq_ignore_ascii_case(&name[..len])
}

static RECEIVED: AtomicU64 = AtomicU64::new(0);

/// Chunks this process has received through shared memory (a diagnostic).
pub fn chunks_received() -> u64 {
    RECEIVED.load(Ordering::Relaxed)
}

/// A ring offered to one sample stream.
#[derive(Clone)]
pub struct Ring(Arc<Mapping>);

struct Mapping {
    _fd: OwnedFd,
    /// A read-only shared mapping of the file, valid until drop.
    base: *const u8,
    map_len: usize,
    size: usize,
    offer: RingOffer,
    state: Mutex<Releases>,
    /// The process that made it: a forked child leaves the parent's bookkeeping alone.
    pid: u32,
}

// SAFETY: `base` is a mapping owned by this struct and valid until drop, only ever read
// (through `Slice`s); the mutable state is behind a mutex.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

/// Running byte counts: everything below `tail` is released; `received` is the end of the
/// last chunk the server placed; `released` holds released ranges above `tail`.
#[derive(Default)]
struct Releases {
    tail: u64,
    received: u64,
    released: BTreeMap<u64, u64>,
    reported: u64,
}

impl Ring {
    /// A ring with `size` data bytes, or why not (no memfd, no sealing: fall back to inline).
    pub fn create(size: usize) -> io::Result<Ring> {
        if !(MIN_RING_BYTES..=MAX_RING_BYTES).contains(&(size as u64)) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a ring holds {MIN_RING_BYTES} to {MAX_RING_BYTES} bytes, not {size}"),
            ));
        }
        let name = CString::new(MEMFD_NAME).expect("no NUL in the name");
        // SAFETY: `name` is a valid C string; the returned descriptor is checked and owned.
        let raw = unsafe {
            // (The system call, not glibc's wrapper, which glibc has only from 2.27 on: the
            // wheel runs on glibc 2.17.)
            libc::syscall(
                libc::SYS_memfd_create,
                name.as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            ) as libc::c_int
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let map_len = DATA_OFFSET + size;
        // SAFETY: plain syscalls on a descriptor we own.
        unsafe {
            if libc::ftruncate(fd.as_raw_fd(), map_len as libc::off_t) != 0
                // The server maps it too: the file must never shrink under its mapping.
                || libc::fcntl(
                    fd.as_raw_fd(),
                    libc::F_ADD_SEALS,
                    libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL,
                ) != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        // Written, not stored through a mapping: a failure is an error, not a SIGBUS.
        let token: [u8; TOKEN_LEN] = rand::random();
        // SAFETY: writes `token` to a descriptor we own.
        let n = unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                token.as_ptr() as *const libc::c_void,
                TOKEN_LEN,
                0,
            )
        };
        if n != TOKEN_LEN as isize {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: maps `map_len` bytes of a file of that size, which cannot shrink; checked
        // for failure below. Reading a page nobody wrote gives zeros, never a fault.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = base as *const u8;
        let offer = RingOffer {
            pid: reverb_proto::process::id(),
            fd: fd.as_raw_fd(),
            size: size as u64,
            token,
        };
        Ok(Ring(Arc::new(Mapping {
            _fd: fd,
            base,
            map_len,
            size,
            offer,
            state: Mutex::new(Releases::default()),
            pid: reverb_proto::process::id(),
        })))
    }

    /// The offer to send in the call's metadata.
    pub fn offer(&self) -> String {
        self.0.offer.encode()
    }

    /// The chunk the server says it wrote at running position `position`, `len` bytes long.
    /// Positions must come in order, and a chunk may not overlap bytes not yet released.
    pub fn take(&self, position: u64, len: u64) -> Result<Bytes, String> {
        let m = &self.0;
        let size = m.size as u64;
        let offset = position % size;
        {
            let mut st = m.state.lock();
            let end = position.checked_add(len).ok_or("position overflows")?;
            if len == 0 || position < st.received || end > st.tail + size || offset + len > size {
                return Err(format!(
                    "shared-memory chunk at {position} (+{len}) is outside the ring's free \
                     space ({} to {}, ring of {size} bytes)",
                    st.received,
                    st.tail + size
                ));
            }
            // A gap before the chunk is padding the server skipped at the ring's end.
            let gap_start = st.received;
            st.received = end;
            if position > gap_start {
                st.release(gap_start, position);
            }
        }
        RECEIVED.fetch_add(1, Ordering::Relaxed);
        Ok(Bytes::from_owner(Slice {
            ring: self.clone(),
            position,
            offset: offset as usize,
            len: len as usize,
        }))
    }

    /// The released prefix, if it moved at least `min_step` bytes since last reported.
    pub fn unreported(&self, min_step: u64) -> Option<u64> {
        let st = self.0.state.lock();
        (st.tail >= st.reported + min_step.max(1)).then_some(st.tail)
    }

    /// Records that the server was told of releases up to `released`.
    pub fn reported(&self, released: u64) {
        let mut st = self.0.state.lock();
        st.reported = st.reported.max(released);
    }

    /// The released prefix if it moved since last reported, now counted as reported (for a
    /// message that will surely be sent).
    pub fn report(&self) -> Option<u64> {
        let released = self.unreported(1)?;
        self.reported(released);
        Some(released)
    }

    /// Ring data bytes.
    pub fn size(&self) -> usize {
        self.0.size
    }
}

impl Releases {
    fn release(&mut self, start: u64, end: u64) {
        self.released.insert(start, end);
        while let Some(end) = self.released.remove(&self.tail) {
            self.tail = end;
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `create`; no `Slice` is left (each holds the Arc).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.map_len) };
    }
}

/// A chunk's bytes in the ring; its space is released on drop.
struct Slice {
    ring: Ring,
    position: u64,
    offset: usize,
    len: usize,
}

impl AsRef<[u8]> for Slice {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `take` checked that the region lies inside the mapping (alive while this
        // slice holds the ring) and overlaps no other unreleased chunk. Another process (the
        // server) can write the file: a correct one writes only released space, and this
        // region is released only when this slice drops. A faulty one can only make these
        // bytes wrong (they are checked when decoded, as bytes off a socket would be).
        unsafe {
            std::slice::from_raw_parts(self.ring.0.base.add(DATA_OFFSET + self.offset), self.len)
        }
    }
}

impl Drop for Slice {
    fn drop(&mut self) {
        // In a forked child the lock may have been held by a thread that does not exist
        // there, and the releases would reach no server anyway.
        if reverb_proto::process::id() == self.ring.0.pid {
            let end = self.position + self.len as u64;
            self.ring.0.state.lock().release(self.position, end);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes as the server would.
    fn write(ring: &Ring, position: u64, data: &[u8]) {
        let offset = DATA_OFFSET as u64 + position % ring.size() as u64;
        // SAFETY: writes from a valid slice to the ring's descriptor.
        let n = unsafe {
            libc::pwrite(
                ring.0._fd.as_raw_fd(),
                data.as_ptr() as *const libc::c_void,
                data.len(),
                offset as libc::off_t,
            )
        };
        assert_eq!(n, data.len() as isize);
    }

    #[test]
    fn chunks_release_out_of_order_and_padding_counts_as_released() {
        let ring = Ring::create(1 << 20).unwrap();
        let size = ring.size() as u64;
        write(&ring, 0, b"first");
        write(&ring, 100, b"second");
        let a = ring.take(0, 5).unwrap();
        let b = ring.take(100, 6).unwrap(); // bytes 5..100 are padding
        assert_eq!((&a[..], &b[..]), (&b"first"[..], &b"second"[..]));
        assert_eq!(
            ring.report(),
            None,
            "nothing before the first chunk was released"
        );
        drop(b);
        assert_eq!(ring.report(), None);
        drop(a);
        assert_eq!(ring.report(), Some(106));
        assert_eq!(ring.report(), None, "already reported");
        // A chunk may not overlap unreleased bytes, go backwards, or cross the ring's end.
        let c = ring.take(size, 10).unwrap();
        assert!(
            ring.take(size + 5, 1).is_err(),
            "overlaps the previous chunk"
        );
        // (the padding before it, up to `size`, was released)
        assert!(
            ring.take(2 * size + 5, 1).is_err(),
            "wraps onto unreleased bytes"
        );
        assert!(
            ring.take(106 + size, 1).is_ok(),
            "released space is reusable"
        );
        assert!(ring.take(2 * size - 1, 2).is_err(), "crosses the end");
        assert!(ring.take(size + 10, 0).is_err(), "empty");
        assert!(Ring::create(0).is_err() && Ring::create(1 << 40).is_err());
        assert!(ring.take(u64::MAX, 2).is_err(), "overflows");
        drop(c);
        assert_eq!(ring.report(), Some(size + 107));
    }

    #[test]
    fn local_addresses_are_recognised() {
        for yes in [
            "localhost:1",
            "127.0.0.1:80",
            "[::1]:5",
            "http://localhost:9",
            "0.0.0.0:1",
        ] {
            assert!(is_this_host(yes), "{yes}");
        }
        for no in ["example.com:1", "10.1.2.3:4", "[2001:db8::1]:5"] {
            assert!(!is_this_host(no), "{no}");
        }
    }

    #[test]
    fn the_ring_outlives_its_handle_while_chunks_are_held() {
        let ring = Ring::create(1 << 20).unwrap();
        write(&ring, 0, b"kept");
        let kept = ring.take(0, 4).unwrap();
        drop(ring);
        assert_eq!(&kept[..], b"kept");
    }
}
