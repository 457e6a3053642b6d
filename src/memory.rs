//! Memory accounting per thread: how much a parser thread has allocated and not freed, so
//! that extraction can be held to a ceiling (`--max-extract-mb`) whatever the format.
//!
//! [`Counting`] wraps the process's allocator (the `ragline` binary installs it around
//! mimalloc). A thread that enters an [`Account`] has every allocation and free it makes
//! added to that account's balance; the code that started it watches the balance and stops
//! waiting when it passes the ceiling. Threads outside an account pay one thread-local read
//! per allocation and nothing else.
//!
//! What the balance is: bytes allocated minus bytes freed *by that thread*. Memory it hands
//! to another thread and is freed there stays counted (the parser's output is part of what
//! it cost), and memory freed on it that another thread allocated lowers it. That is the
//! right measure of a runaway parser: its allocations grow without bound.
//!
//! Where the binary does not install [`Counting`] (the library used from another program),
//! balances stay at zero and only the formats' own limits bound memory: [`installed`] tells.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

thread_local! {
    /// The account this thread's allocations go to (null: none). A const-initialised cell
    /// without a destructor: reading it never allocates, so the allocator may use it.
    static CURRENT: Cell<*const AtomicI64> = const { Cell::new(std::ptr::null()) };
}

static INSTALLED: AtomicBool = AtomicBool::new(false);

/// True once an allocation went through [`Counting`]: balances mean something.
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

/// A global allocator that charges each allocation to the current thread's [`Account`].
pub struct Counting<A> {
    inner: A,
}

impl<A> Counting<A> {
    pub const fn new(inner: A) -> Self {
        Counting { inner }
    }
}

#[inline]
fn charge(delta: i64) {
    // `try_with`: during thread teardown the slot may be gone; then nothing is counted.
    let _ = CURRENT.try_with(|c| {
        let p = c.get();
        if !p.is_null() {
            // SAFETY: a non-null pointer is set only by `Account::enter`, whose guard keeps
            // the `Arc` (and so the counter) alive until it clears the pointer again.
            unsafe { &*p }.fetch_add(delta, Ordering::Relaxed);
        }
    });
}

// SAFETY: every method forwards to the inner allocator with the same arguments; the
// accounting only touches an atomic counter and never allocates or unwinds.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    /// # Safety
    /// As [`GlobalAlloc::alloc`].
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !INSTALLED.load(Ordering::Relaxed) {
            INSTALLED.store(true, Ordering::Relaxed);
        }
        let p = self.inner.alloc(layout);
        if !p.is_null() {
            charge(layout.size() as i64);
        }
        p
    }

    /// # Safety
    /// As [`GlobalAlloc::alloc_zeroed`].
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = self.inner.alloc_zeroed(layout);
        if !p.is_null() {
            charge(layout.size() as i64);
        }
        p
    }

    /// # Safety
    /// As [`GlobalAlloc::dealloc`].
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        self.inner.dealloc(ptr, layout);
        charge(-(layout.size() as i64));
    }

    /// # Safety
    /// As [`GlobalAlloc::realloc`].
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = self.inner.realloc(ptr, layout, new_size);
        if !p.is_null() {
            charge(new_size as i64 - layout.size() as i64);
        }
        p
    }
}

/// A balance of bytes allocated and not freed by the threads that entered it.
#[derive(Clone, Debug, Default)]
pub struct Account {
    bytes: Arc<AtomicI64>,
}

impl Account {
    pub fn new() -> Self {
        Account::default()
    }

    /// Bytes allocated and not freed so far (never below zero).
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed).max(0) as u64
    }

    /// Charge this thread's allocations to the account until the guard is dropped.
    pub fn enter(&self) -> Entered {
        let counter = Arc::clone(&self.bytes);
        let previous = CURRENT.with(|c| c.replace(Arc::as_ptr(&counter)));
        Entered { counter, previous }
    }
}

/// While alive, this thread's allocations go to an account.
pub struct Entered {
    counter: Arc<AtomicI64>,
    previous: *const AtomicI64,
}

impl Drop for Entered {
    fn drop(&mut self) {
        let previous = self.previous;
        CURRENT.with(|c| c.set(previous));
        // The counter may be freed only after the pointer to it is gone.
        let _ = &self.counter;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_threads_allocations_are_charged_to_the_account_it_entered() {
        // The library's unit tests run with `Counting` installed (lib.rs).
        assert!(installed());
        let a = Account::new();
        let b = Account::new();
        let kept;
        {
            let _in_a = a.enter();
            {
                let _in_b = b.enter();
                let freed = vec![7u8; 1 << 20];
                drop(freed);
                // Still held when the thread leaves the account: counted.
                kept = vec![1u8; 3 << 20];
            }
            let _w = vec![0u8; 4096];
            assert!(a.bytes() >= 4096, "{}", a.bytes());
        }
        assert!(b.bytes() >= 3 << 20, "{}", b.bytes());
        assert!(b.bytes() < 4 << 20, "freed bytes came off: {}", b.bytes());
        assert!(
            a.bytes() < 1 << 20,
            "b's allocations are not a's: {}",
            a.bytes()
        );
        // Outside any account nothing is charged.
        let before = (a.bytes(), b.bytes());
        let _more = vec![0u8; 1 << 20];
        assert_eq!((a.bytes(), b.bytes()), before);
        CURRENT.with(|c| assert!(c.get().is_null()));
        drop(kept);
    }
}
