//! The server side of the shared-memory sample transport (see `reverb_proto::shm`): opens the
//! ring a client on this host offers and writes chunk bytes into its free space. Anything
//! unexpected (another host, another user, a file that is not a sealed ring, a wrong token)
//! means no ring, and samples go inline as usual.

use reverb_proto::shm::{
    RingOffer, DATA_OFFSET, MAX_RING_BYTES, MEMFD_NAME, MIN_RING_BYTES, TOKEN_LEN,
};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A client's ring, mapped into this process.
pub(crate) struct RingWriter {
    base: *mut u8,
    map_len: usize,
    size: u64,
    /// Running count of bytes placed (including padding skipped at the ring's end).
    written: u64,
    /// Running count of bytes the client says it has consumed.
    released: Arc<AtomicU64>,
}

// SAFETY: `base` is a mapping owned by this writer (unmapped on drop); only the writer's owner
// writes through it.
unsafe impl Send for RingWriter {}

impl RingWriter {
    /// Maps the ring `offer` describes, or `None` when it is not a ring of a client on this
    /// host that this process may open.
    pub(crate) fn open(offer: &str) -> Option<RingWriter> {
        let offer = RingOffer::parse(offer)?;
        if !(MIN_RING_BYTES..=MAX_RING_BYTES).contains(&offer.size) || offer.fd < 0 {
            return None;
        }
        let path = format!("/proc/{}/fd/{}", offer.pid, offer.fd);
        // Only open memfds of that name: opening an arbitrary descriptor (a device, a FIFO)
        // could have side effects.
        let link = std::fs::read_link(&path).ok()?;
        if !link
            .to_string_lossy()
            .starts_with(&format!("/memfd:{MEMFD_NAME}"))
        {
            return None;
        }
        let c_path = CString::new(path).ok()?;
        let flags = libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK;
        // SAFETY: `c_path` is a valid C string; the descriptor is checked and owned.
        let raw = unsafe { libc::open(c_path.as_ptr(), flags) };
        if raw < 0 {
            return None;
        }
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let map_len = DATA_OFFSET.checked_add(usize::try_from(offer.size).ok()?)?;
        // SAFETY: `stat` is plain data, filled by `fstat` on a descriptor we own.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let seals = unsafe {
            if libc::fstat(fd.as_raw_fd(), &mut stat) != 0 {
                return None;
            }
            libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS)
        };
        // The file may never shrink: writing past its end would kill this process (SIGBUS).
        if stat.st_mode & libc::S_IFMT != libc::S_IFREG
            || (stat.st_size as u64) < map_len as u64
            || seals < 0
            || seals & libc::F_SEAL_SHRINK == 0
        {
            return None;
        }
        // SAFETY: maps `map_len` bytes of a file at least that long that cannot shrink.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let writer = RingWriter {
            base: base as *mut u8,
            map_len,
            size: offer.size,
            written: 0,
            released: Arc::new(AtomicU64::new(0)),
        };
        let mut token = [0u8; TOKEN_LEN];
        // SAFETY: the first page is inside the mapping; the client wrote it before offering.
        unsafe { std::ptr::copy_nonoverlapping(writer.base, token.as_mut_ptr(), TOKEN_LEN) };
        (token == offer.token).then_some(writer)
    }

    /// Where the client's releases go (`SampleStreamRequest.shm_released`).
    pub(crate) fn releases(&self) -> Arc<AtomicU64> {
        self.released.clone()
    }

    /// Copies `data` into free ring space and returns its running position, or `None` when it
    /// does not fit now (the caller sends it inline).
    pub(crate) fn put(&mut self, data: &[u8]) -> Option<u64> {
        let len = data.len() as u64;
        if len == 0 || len > self.size / 2 {
            return None;
        }
        // A chunk never wraps: skip to the ring's start when it would.
        let offset = self.written % self.size;
        let position = if offset + len > self.size {
            self.written + (self.size - offset)
        } else {
            self.written
        };
        let released = self.released.load(Ordering::Acquire).min(self.written);
        if position + len - released > self.size {
            return None;
        }
        // SAFETY: `[offset, offset + len)` is inside the mapping (no wrap, checked above) and
        // is space the client has released, so it reads none of it now.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.base.add(DATA_OFFSET + (position % self.size) as usize),
                data.len(),
            )
        };
        self.written = position + len;
        Some(position)
    }
}

impl Drop for RingWriter {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `open`.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.map_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reverb_client::shm::Ring;
    use std::io::Write;

    const SIZE: usize = 1 << 20;

    fn offer_with(ring: &Ring, f: impl FnOnce(&mut RingOffer)) -> String {
        let mut offer = RingOffer::parse(&ring.offer()).unwrap();
        f(&mut offer);
        offer.encode()
    }

    #[test]
    fn chunks_written_are_read_back_and_a_full_ring_refuses_until_released() {
        let ring = Ring::create(SIZE).unwrap();
        let mut writer = RingWriter::open(&ring.offer()).expect("a ring of this process opens");
        let chunk: Vec<u8> = (0..SIZE / 3).map(|i| (i % 251) as u8).collect();
        let mut held = Vec::new();
        // Three thirds fit; the fourth does not until the first is released.
        while let Some(position) = writer.put(&chunk) {
            held.push(ring.take(position, chunk.len() as u64).unwrap());
        }
        assert_eq!(held.len(), 3);
        assert!(held.iter().all(|b| b[..] == chunk[..]));
        held.remove(0);
        let released = ring.report(1).expect("the first chunk was released");
        writer.releases().store(released, Ordering::Release);
        // The rest of the ring (a third's tail) is too short: the chunk starts over at 0.
        let position = writer.put(&chunk).expect("fits after the release");
        assert_eq!(position, SIZE as u64);
        let back = ring.take(position, chunk.len() as u64).unwrap();
        assert_eq!(back[..], chunk[..]);
        // Chunks over half the ring, and empty ones, always go inline.
        assert_eq!(writer.put(&vec![0; SIZE / 2 + 1]), None);
        assert_eq!(writer.put(&[]), None);
    }

    #[test]
    fn a_client_claiming_too_much_only_hurts_itself() {
        // Claims are capped at what was written: the server reuses space the client still
        // reads (its own data gets overwritten), but never writes outside the ring.
        let ring = Ring::create(SIZE).unwrap();
        let mut writer = RingWriter::open(&ring.offer()).unwrap();
        writer.releases().store(u64::MAX, Ordering::Release);
        let chunk = vec![7u8; SIZE / 3];
        let mut last = None;
        for _ in 0..10 {
            let position = writer.put(&chunk).unwrap();
            assert!(position % SIZE as u64 + chunk.len() as u64 <= SIZE as u64);
            assert!(last.is_none_or(|l| position > l));
            last = Some(position);
        }
    }

    #[test]
    fn offers_that_are_not_this_clients_ring_are_refused() {
        let ring = Ring::create(SIZE).unwrap();
        assert!(RingWriter::open("junk").is_none());
        assert!(RingWriter::open(&offer_with(&ring, |o| o.token[0] ^= 1)).is_none());
        assert!(RingWriter::open(&offer_with(&ring, |o| o.size *= 2)).is_none());
        assert!(RingWriter::open(&offer_with(&ring, |o| o.size = 1024)).is_none());
        assert!(RingWriter::open(&offer_with(&ring, |o| o.pid = u32::MAX)).is_none());
        // A plain file of this process, with the right token, is not a ring.
        let mut file = tempfile();
        let token = RingOffer::parse(&ring.offer()).unwrap().token;
        file.write_all(&token).unwrap();
        file.set_len((DATA_OFFSET + SIZE) as u64).unwrap();
        let fd = file.as_raw_fd();
        assert!(RingWriter::open(&offer_with(&ring, |o| o.fd = fd)).is_none());
        // An unsealed memfd of the right name could shrink under the mapping: refused.
        let name = CString::new(MEMFD_NAME).unwrap();
        // SAFETY: a valid C string; the descriptor is owned below.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: a fresh descriptor.
        let memfd = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(raw) });
        let mut memfd_w = &memfd;
        memfd_w.write_all(&token).unwrap();
        memfd.set_len((DATA_OFFSET + SIZE) as u64).unwrap();
        assert!(RingWriter::open(&offer_with(&ring, |o| o.fd = raw)).is_none());
        assert!(
            RingWriter::open(&ring.offer()).is_some(),
            "the real offer still opens"
        );
    }

    fn tempfile() -> std::fs::File {
        let path = std::env::temp_dir().join(format!("reverb-shm-test-{}", rand::random::<u64>()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        file
    }
}
