//! The allocator of processes that hold tables: the system's, with big allocations (a
//! table's key indexes, its sum tree, its list of keys) advised to the kernel as huge-page
//! candidates. A table of millions of items reaches its indexes at random keys; with 4 KiB
//! pages nearly every such access also misses the TLB, which made inserts into a 10M-item
//! table about 1.5x as costly as into a 1M-item one. Where transparent huge pages are off
//! the advice is ignored, and small allocations are untouched.

use std::alloc::{GlobalAlloc, Layout, System};

/// A huge page (x86-64 and aarch64 with 4 KiB base pages).
const HUGE_PAGE: usize = 2 << 20;
/// A base page.
const PAGE: usize = 4096;
/// Allocations at least this big are advised (smaller ones gain little, and a huge page
/// could hold memory a small one never touches).
const ADVISED: usize = 4 * HUGE_PAGE;

/// [`System`], advising the huge pages inside allocations of [`ADVISED`] bytes or more.
pub struct HugePageAlloc;

// SAFETY: every call is forwarded to `System` with the same arguments, so the allocator
// contract holds as it does for `System`; `advise` only gives the kernel advice about pages
// inside the allocation just returned.
unsafe impl GlobalAlloc for HugePageAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        advise(unsafe { System.alloc(layout) }, layout.size())
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        advise(unsafe { System.alloc_zeroed(layout) }, layout.size())
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        advise(unsafe { System.realloc(ptr, layout, new_size) }, new_size)
    }
}

/// Advises the pages of `[ptr, ptr + len)` (rounded outwards to whole pages) when `len` is
/// big enough; returns `ptr`. The kernel backs the aligned 2 MiB stretches inside with huge
/// pages. Rounding outwards, not inwards to huge-page boundaries, keeps a block the system
/// allocator mapped on its own one mapping, so that it can still grow it in place (`mremap`
/// refuses a range split into several mappings).
fn advise(ptr: *mut u8, len: usize) -> *mut u8 {
    if ptr.is_null() || len < ADVISED {
        return ptr;
    }
    let start = ptr as usize & !(PAGE - 1);
    let end = (ptr as usize + len).next_multiple_of(PAGE);
    // SAFETY: the range covers the allocation just made and at most the rest of its first
    // and last pages; MADV_HUGEPAGE only advises, changing no contents of this or any
    // neighbouring allocation, and its failure (e.g. THP not built in) is harmless.
    unsafe {
        libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
    }
    ptr
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_and_small_allocations_work_and_keep_their_contents() {
        let a = HugePageAlloc;
        for size in [16, ADVISED - 1, ADVISED, 3 * ADVISED + 12345] {
            let layout = Layout::from_size_align(size, 64).unwrap();
            // SAFETY: a non-zero layout; the memory is written within it and freed once.
            unsafe {
                let p = a.alloc_zeroed(layout);
                assert!(!p.is_null());
                assert_eq!(*p.add(size - 1), 0);
                *p = 7;
                *p.add(size - 1) = 9;
                let q = a.realloc(p, layout, size * 2);
                assert!(!q.is_null());
                assert_eq!((*q, *q.add(size - 1)), (7, 9));
                a.dealloc(q, Layout::from_size_align(size * 2, 64).unwrap());
            }
        }
    }
}
