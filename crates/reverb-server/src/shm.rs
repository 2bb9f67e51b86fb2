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
use std::sync::{Arc, OnceLock};

/// Most ring bytes this process has mapped at once, over all streams.
const MAX_TOTAL_RING_BYTES: u64 = 4 << 30;
static RING_BYTES_IN_USE: AtomicU64 = AtomicU64::new(0);

/// A client's ring, mapped here. A write to a mapped page the kernel cannot provide kills
/// the process (SIGBUS): the ring's pages are therefore allocated with `fallocate` (where
/// failing is only an error) before the first write, the file cannot shrink, it is a plain
/// memfd (no huge pages), and only rings of processes of the same user are opened (which
/// could kill this process anyway).
pub(crate) struct RingWriter {
    fd: OwnedFd,
    base: *mut u8,
    map_len: usize,
    /// Pages are allocated (on the first write).
    allocated: bool,
    size: u64,
    /// Running count of bytes placed (including padding skipped at the ring's end).
    written: u64,
    /// Running count of bytes the client says it has consumed.
    released: Arc<AtomicU64>,
    /// Allocating the pages failed: everything goes inline.
    broken: bool,
}

// SAFETY: `base` is a mapping owned by this writer (unmapped on drop), written only through
// `&mut self`.
unsafe impl Send for RingWriter {}

impl RingWriter {
    /// Opens the ring `offer` describes, or `None` when it is not a ring of a client on this
    /// host that this process may open.
    pub(crate) fn open(offer: &str) -> Option<RingWriter> {
        let offer = RingOffer::parse(offer)?;
        if !(MIN_RING_BYTES..=MAX_RING_BYTES).contains(&offer.size) || offer.fd < 0 {
            return None;
        }
        // Only processes of this user (which could kill this process anyway).
        let owner = std::fs::metadata(format!("/proc/{}", offer.pid)).ok()?;
        // SAFETY: geteuid cannot fail.
        if std::os::unix::fs::MetadataExt::uid(&owner) != unsafe { libc::geteuid() } {
            return None;
        }
        let path = format!("/proc/{}/fd/{}", offer.pid, offer.fd);
        // A cheap first filter; the checks that matter are on the file itself, below.
        let link = std::fs::read_link(&path).ok()?;
        if !link
            .to_string_lossy()
            .starts_with(&format!("/memfd:{MEMFD_NAME}"))
        {
            return None;
        }
        // O_PATH pins the file without opening it (opening a device or a FIFO could have
        // side effects or block); only a memfd (a regular file on the memfd filesystem, so
        // no hugetlbfs, FUSE or device) is then reopened for writing.
        let pinned = open(&path, libc::O_PATH | libc::O_CLOEXEC)?;
        let stat = fstat(&pinned)?;
        let map_len = (DATA_OFFSET as u64).checked_add(offer.size)?;
        if stat.st_mode & libc::S_IFMT != libc::S_IFREG
            || Some(stat.st_dev) != memfd_device()
            || (stat.st_size as u64) < map_len
        {
            return None;
        }
        let fd = open(
            &format!("/proc/self/fd/{}", pinned.as_raw_fd()),
            libc::O_RDWR | libc::O_CLOEXEC,
        )?;
        // SAFETY: a plain fcntl on a descriptor we own.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return None;
        }
        let mut token = [0u8; TOKEN_LEN];
        // SAFETY: reads at most `token.len()` bytes into `token`.
        let n = unsafe {
            libc::pread(
                fd.as_raw_fd(),
                token.as_mut_ptr() as *mut libc::c_void,
                TOKEN_LEN,
                0,
            )
        };
        if n != TOKEN_LEN as isize || token != offer.token {
            return None;
        }
        let map_len = usize::try_from(map_len).ok()?;
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
        let in_use = RING_BYTES_IN_USE.fetch_add(offer.size, Ordering::AcqRel);
        let writer = RingWriter {
            fd,
            base: base as *mut u8,
            map_len,
            allocated: false,
            size: offer.size,
            written: 0,
            released: Arc::new(AtomicU64::new(0)),
            broken: false,
        };
        // Dropping the writer gives the bytes back to the budget.
        (in_use + offer.size <= MAX_TOTAL_RING_BYTES).then_some(writer)
    }

    /// Where the client's releases go (`SampleStreamRequest.shm_released`).
    pub(crate) fn releases(&self) -> Arc<AtomicU64> {
        self.released.clone()
    }

    /// Writes `data` into free ring space and returns its running position, or `None` when it
    /// does not fit now (the caller sends it inline).
    pub(crate) fn put(&mut self, data: &[u8]) -> Option<u64> {
        let len = data.len() as u64;
        if self.broken || len == 0 || len > self.size / 2 {
            return None;
        }
        if !self.allocated {
            // SAFETY: a plain fallocate on a descriptor we own, inside the file's size.
            let err = unsafe {
                libc::fallocate(
                    self.fd.as_raw_fd(),
                    0,
                    DATA_OFFSET as libc::off_t,
                    self.size as libc::off_t,
                )
            };
            self.broken = err != 0;
            self.allocated = !self.broken;
            if self.broken {
                return None;
            }
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
        // SAFETY: `[offset, offset + len)` is inside the mapping (no wrap, checked above),
        // its pages are allocated, and it is space the client has released, so it reads none
        // of it now.
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
        RING_BYTES_IN_USE.fetch_sub(self.size, Ordering::AcqRel);
    }
}

fn open(path: &str, flags: libc::c_int) -> Option<OwnedFd> {
    let c_path = CString::new(path).ok()?;
    // SAFETY: `c_path` is a valid C string; the descriptor is checked and owned.
    let raw = unsafe { libc::open(c_path.as_ptr(), flags) };
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw) })
}

fn fstat(fd: &OwnedFd) -> Option<libc::stat> {
    // SAFETY: `stat` is plain data, filled by `fstat` on a descriptor we own.
    unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        (libc::fstat(fd.as_raw_fd(), &mut stat) == 0).then_some(stat)
    }
}

/// The device of memfd files (of this process's own probe memfd).
fn memfd_device() -> Option<libc::dev_t> {
    static DEVICE: OnceLock<Option<libc::dev_t>> = OnceLock::new();
    *DEVICE.get_or_init(|| {
        let name = CString::new("reverb-probe").ok()?;
        // SAFETY: a valid C string; the descriptor is checked and owned.
        // (The system call: glibc's wrapper exists only from 2.27 on, the wheel runs on 2.17.)
        let raw = unsafe { libc::syscall(libc::SYS_memfd_create, name.as_ptr(), libc::MFD_CLOEXEC) }
            as libc::c_int;
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        let probe = (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw) })?;
        fstat(&probe).map(|s| s.st_dev)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use reverb_client::transport::shm::Ring;
    use std::io::Write;

    const SIZE: usize = 1 << 20;

    /// The ring budget is process-wide: the test that fills it runs alone (write lock),
    /// the others beside each other (read locks).
    static BUDGET: std::sync::RwLock<()> = std::sync::RwLock::new(());

    fn share_budget() -> std::sync::RwLockReadGuard<'static, ()> {
        BUDGET.read().unwrap_or_else(|e| e.into_inner())
    }

    fn offer_with(ring: &Ring, f: impl FnOnce(&mut RingOffer)) -> String {
        let mut offer = RingOffer::parse(&ring.offer()).unwrap();
        f(&mut offer);
        offer.encode()
    }

    #[test]
    fn chunks_written_are_read_back_and_a_full_ring_refuses_until_released() {
        let _budget = share_budget();
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
        let released = ring.unreported(1).expect("the first chunk was released");
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
        let _budget = share_budget();
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
        let _budget = share_budget();
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
        let raw = unsafe { libc::syscall(libc::SYS_memfd_create, name.as_ptr(), libc::MFD_CLOEXEC) }
            as libc::c_int;
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

    #[test]
    fn rings_share_a_budget_of_bytes() {
        let _budget = BUDGET.write().unwrap_or_else(|e| e.into_inner());
        let size = MAX_RING_BYTES as usize; // sparse: no memory is used
        let rings: Vec<Ring> = (0..17).map(|_| Ring::create(size).unwrap()).collect();
        let mut writers: Vec<RingWriter> = rings
            .iter()
            .map_while(|r| RingWriter::open(&r.offer()))
            .collect();
        // (Other tests may hold a small ring meanwhile.)
        let fit = (MAX_TOTAL_RING_BYTES / MAX_RING_BYTES) as usize;
        assert!(
            writers.len() == fit || writers.len() == fit - 1,
            "{}",
            writers.len()
        );
        writers.pop();
        assert!(
            RingWriter::open(&rings[16].offer()).is_some(),
            "the budget came back"
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
