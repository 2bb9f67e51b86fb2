//! This process's id, read once per process: `getpid` is a system call, and the registry of
//! in-process servers and the client's runtimes ask for it on every call to tell a child of
//! `fork` from its parent.

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

/// The cached id; 0 until read, and again in a child of `fork` until it reads its own.
static PID: AtomicU32 = AtomicU32::new(0);

/// Clears the cache in a child of `fork` (run by the C library in the child, before `fork`
/// returns there).
extern "C" fn forget_in_child() {
    PID.store(0, Ordering::Relaxed);
}

/// This process's id, as [`std::process::id`], without a system call once read: a child of
/// `fork` reads its own (the cache is cleared in the child).
pub fn id() -> u32 {
    // 0: not watching forks yet, 1: starting to, 2: watching, 3: could not (no memory). (An
    // atomic, not a `Once`: a fork while another thread registers would leave a `Once`
    // running for ever in the child.) The cache is used only once the handler is in place.
    static WATCH: AtomicU8 = AtomicU8::new(0);
    match WATCH.load(Ordering::Acquire) {
        2 => {}
        0 if WATCH
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok() =>
        {
            // SAFETY: registers a handler the C library runs in the child after `fork`; it
            // only stores to an atomic, which is async-signal-safe, so it is sound there.
            let registered = unsafe { libc::pthread_atfork(None, None, Some(forget_in_child)) };
            WATCH.store(if registered == 0 { 2 } else { 3 }, Ordering::Release);
            return std::process::id();
        }
        _ => return std::process::id(),
    }
    match PID.load(Ordering::Relaxed) {
        0 => {
            let pid = std::process::id();
            PID.store(pid, Ordering::Relaxed);
            pid
        }
        pid => pid,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_cached_id_is_this_process_and_a_forked_child_reads_its_own() {
        assert_eq!(super::id(), std::process::id());
        assert_eq!(super::id(), std::process::id());
        // SAFETY: the child only calls async-signal-safe functions (getpid, write, _exit)
        // and the cached read, which allocates nothing.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork failed");
        if child == 0 {
            let ok = super::id() == std::process::id() && super::id() != 0;
            // SAFETY: ends the child at once, without running the parent's destructors.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked; `status` is a valid out-pointer.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }
}
