//! The allocator of a plugin component (feature `call-allocator`, on by
//! default; wasm targets without threads only).
//!
//! The host runs every call in a new instance and throws its memory away
//! afterwards, so a plugin's heap lives for one call. This allocator is
//! built for that: blocks come off the top of the heap (a bump pointer),
//! freed blocks go onto one list per size class and are handed out again
//! first, and nothing is ever returned to the system.
//!
//! - Requests up to 64 KiB are rounded up to a power of two (16 B, 32 B, …,
//!   64 KiB): one free list per size. Allocation and freeing are a list
//!   push or pop, or moving the top.
//! - Larger blocks carry a 16-byte header with their size; freed ones are
//!   kept on one list and reused first-fit.
//! - Freeing the block just below the top moves the top back, and growing
//!   (`realloc`) the block just below the top extends it in place, so a
//!   growing buffer (the plan's JSON text) is not copied at every doubling.
//! - The heap starts in the part of the plugin's initial memory that its
//!   data and stack leave free (plugins start with 2 MiB): on first use it
//!   takes that stretch, less 64 KiB for the C library, as one block from
//!   the C library's allocator, which owns it. A call whose heap fits there
//!   never grows the memory.
//! - Beyond it the heap grows with `memory.grow` by the pages a request
//!   lacks, as the default allocator does, so the host's memory cap stops it
//!   at the same point: a refused growth is an allocation failure, which
//!   traps and is reported as "out of memory".
//!
//! Alignments above 16 (rare) are served from the top and never reused.

use core::alloc::Layout;
use core::ptr;

/// A wasm page.
const PAGE: usize = 65536;
/// Every block starts at a multiple of this.
const ALIGN: usize = 16;
/// log2 of the smallest class.
const MIN_SHIFT: u32 = 4;
/// log2 of the largest class with its own free list.
const MAX_SHIFT: u32 = 16;
/// Number of small classes.
const CLASSES: usize = (MAX_SHIFT - MIN_SHIFT + 1) as usize;
/// Size of a large block's header.
const HEADER: usize = ALIGN;

/// Where the heap's memory comes from: the component's linear memory, or
/// a fake in the tests.
pub(crate) trait Memory {
    /// Address one past the memory's last byte.
    fn end(&self) -> usize;
    /// Grows the memory by `pages` pages; the address of the first new
    /// byte, or `None` when refused.
    fn grow(&mut self, pages: usize) -> Option<usize>;
    /// A stretch `start..end` of memory the heap may use before it grows
    /// the memory; asked once, at the heap's first use.
    fn first(&mut self) -> Option<(usize, usize)>;
}

pub(crate) struct Heap<M> {
    memory: M,
    /// Next free byte (a multiple of [`ALIGN`]).
    top: usize,
    /// End of the memory this heap grew; `top..end` is unused.
    end: usize,
    /// Heads of the free lists of the small classes (next pointer in the
    /// block's first word).
    small: [*mut u8; CLASSES],
    /// Free large blocks (payload pointers; next pointer in the first word).
    large: *mut u8,
    /// Whether [`Memory::first`] has been asked.
    started: bool,
}

/// The class of a small request, or `None` for a large one.
fn class_of(size: usize) -> Option<usize> {
    if size > 1 << MAX_SHIFT {
        return None;
    }
    let shift = size
        .max(1)
        .next_power_of_two()
        .trailing_zeros()
        .max(MIN_SHIFT);
    Some((shift - MIN_SHIFT) as usize)
}

fn class_size(class: usize) -> usize {
    1 << (class as u32 + MIN_SHIFT)
}

fn round_up(n: usize, to: usize) -> Option<usize> {
    Some(n.checked_add(to - 1)? & !(to - 1))
}

impl<M: Memory> Heap<M> {
    pub(crate) const fn new(memory: M) -> Self {
        Heap {
            memory,
            top: 0,
            end: 0,
            small: [ptr::null_mut(); CLASSES],
            large: ptr::null_mut(),
            started: false,
        }
    }

    /// Makes `need` bytes available at `top`, growing the memory by the
    /// pages missing.
    fn reserve(&mut self, need: usize) -> bool {
        if self.end - self.top >= need {
            return true;
        }
        if !self.started {
            self.started = true;
            if let Some((start, end)) = self.memory.first()
                && let Some(start) = round_up(start, ALIGN)
                && start < end
            {
                self.top = start;
                self.end = end;
                if end - start >= need {
                    return true;
                }
            }
        }
        let size = self.memory.end();
        // Growth continues this heap only if nothing else grew the memory
        // since (the C library's allocator may).
        let missing = if size == self.end {
            need - (self.end - self.top)
        } else {
            need
        };
        let Some(bytes) = round_up(missing, PAGE) else {
            return false;
        };
        let Some(start) = self.memory.grow(bytes / PAGE) else {
            return false;
        };
        if start != self.end {
            self.top = start;
        }
        self.end = start + bytes;
        // Short only if the memory was grown by someone else in between.
        self.end - self.top >= need || self.reserve(need)
    }

    /// `size` bytes (a multiple of [`ALIGN`]) from the top.
    fn bump(&mut self, size: usize) -> *mut u8 {
        if !self.reserve(size) {
            return ptr::null_mut();
        }
        let p = self.top;
        self.top += size;
        p as *mut u8
    }

    /// Moves the top to `new_top` (above the current one), growing the
    /// memory only where it continues this heap.
    fn extend_top(&mut self, new_top: usize) -> bool {
        if new_top <= self.end {
            self.top = new_top;
            return true;
        }
        if self.memory.end() != self.end {
            return false;
        }
        let Some(bytes) = round_up(new_top - self.end, PAGE) else {
            return false;
        };
        let Some(start) = self.memory.grow(bytes / PAGE) else {
            return false;
        };
        if start != self.end {
            // Cannot happen (one thread, end checked above); the grown
            // pages become the heap's top anyway.
            self.top = start;
            self.end = start + bytes;
            return false;
        }
        self.end += bytes;
        self.top = new_top;
        true
    }

    unsafe fn alloc_small(&mut self, class: usize) -> *mut u8 {
        let head = self.small[class];
        if !head.is_null() {
            // SAFETY: a free block's first word holds the next free block.
            self.small[class] = unsafe { *head.cast::<*mut u8>() };
            return head;
        }
        self.bump(class_size(class))
    }

    unsafe fn free_small(&mut self, p: *mut u8, class: usize) {
        let size = class_size(class);
        if p as usize + size == self.top {
            self.top = p as usize;
        } else {
            // SAFETY: the block is at least 16 bytes, aligned, and ours.
            unsafe { *p.cast::<*mut u8>() = self.small[class] };
            self.small[class] = p;
        }
    }

    /// A large block's payload size.
    unsafe fn large_size(p: *mut u8) -> usize {
        // SAFETY: large payloads follow their header.
        unsafe { *p.sub(HEADER).cast::<usize>() }
    }

    unsafe fn alloc_large(&mut self, size: usize) -> *mut u8 {
        let Some(size) = round_up(size, ALIGN) else {
            return ptr::null_mut();
        };
        // First fit among the freed large blocks.
        let mut link: *mut *mut u8 = &mut self.large;
        // SAFETY: the list holds freed large payloads of this heap, each
        // with its header and its next pointer in the first word.
        unsafe {
            while !(*link).is_null() {
                let p = *link;
                if Self::large_size(p) >= size {
                    *link = *p.cast::<*mut u8>();
                    return p;
                }
                link = p.cast::<*mut u8>();
            }
        }
        let Some(total) = size.checked_add(HEADER) else {
            return ptr::null_mut();
        };
        let block = self.bump(total);
        if block.is_null() {
            return block;
        }
        // SAFETY: `block` is `total` fresh bytes.
        unsafe {
            *block.cast::<usize>() = size;
            block.add(HEADER)
        }
    }

    unsafe fn free_large(&mut self, p: *mut u8) {
        // SAFETY: `p` is a large payload of this heap.
        unsafe {
            if p as usize + Self::large_size(p) == self.top {
                self.top = p as usize - HEADER;
            } else {
                *p.cast::<*mut u8>() = self.large;
                self.large = p;
            }
        }
    }

    /// A block of `align` > [`ALIGN`], from the top, never reused.
    fn alloc_overaligned(&mut self, layout: Layout) -> *mut u8 {
        let Some(total) = layout
            .size()
            .checked_add(layout.align())
            .and_then(|n| round_up(n, ALIGN))
        else {
            return ptr::null_mut();
        };
        let block = self.bump(total);
        if block.is_null() {
            return block;
        }
        let offset = block.align_offset(layout.align());
        // SAFETY: `offset < align`, so the aligned block fits in `total`.
        unsafe { block.add(offset) }
    }
}

impl<M: Memory> Heap<M> {
    /// As `GlobalAlloc::alloc`.
    ///
    /// # Safety
    ///
    /// As `GlobalAlloc::alloc`.
    pub(crate) unsafe fn alloc(&mut self, layout: Layout) -> *mut u8 {
        if layout.align() > ALIGN {
            return self.alloc_overaligned(layout);
        }
        // SAFETY: the heap's invariants hold between calls.
        unsafe {
            match class_of(layout.size()) {
                Some(class) => self.alloc_small(class),
                None => self.alloc_large(layout.size()),
            }
        }
    }

    /// As `GlobalAlloc::dealloc`.
    ///
    /// # Safety
    ///
    /// As `GlobalAlloc::dealloc`: `p` came from this heap with `layout`.
    pub(crate) unsafe fn dealloc(&mut self, p: *mut u8, layout: Layout) {
        if layout.align() > ALIGN {
            return;
        }
        // SAFETY: `p` was allocated here with `layout`, so its class (or
        // header) is what `layout.size()` says.
        unsafe {
            match class_of(layout.size()) {
                Some(class) => self.free_small(p, class),
                None => self.free_large(p),
            }
        }
    }

    /// As `GlobalAlloc::realloc`.
    ///
    /// # Safety
    ///
    /// As `GlobalAlloc::realloc`.
    pub(crate) unsafe fn realloc(
        &mut self,
        p: *mut u8,
        layout: Layout,
        new_size: usize,
    ) -> *mut u8 {
        if layout.align() <= ALIGN {
            match (class_of(layout.size()), class_of(new_size)) {
                (Some(old), Some(new)) => {
                    if new <= old {
                        return p;
                    }
                    // The block just below the top grows in place.
                    if p as usize + class_size(old) == self.top
                        && self.extend_top(p as usize + class_size(new))
                    {
                        return p;
                    }
                }
                (None, None) => {
                    // SAFETY: `p` is a large payload of this heap.
                    let size = unsafe { Self::large_size(p) };
                    if new_size <= size {
                        return p;
                    }
                    if let Some(new) = round_up(new_size, ALIGN)
                        && p as usize + size == self.top
                        && self.extend_top(p as usize + new)
                    {
                        // SAFETY: the header precedes the payload.
                        unsafe { *p.sub(HEADER).cast::<usize>() = new };
                        return p;
                    }
                }
                _ => {}
            }
        }
        // SAFETY: the caller guarantees a valid layout for `new_size`.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: a new block, the old contents copied, the old block freed.
        unsafe {
            let q = self.alloc(new_layout);
            if !q.is_null() {
                ptr::copy_nonoverlapping(p, q, layout.size().min(new_size));
                self.dealloc(p, layout);
            }
            q
        }
    }
}

/// The component's linear memory (memory 0).
#[cfg(target_arch = "wasm32")]
#[derive(Debug)]
pub(crate) struct LinearMemory;

#[cfg(target_arch = "wasm32")]
impl Memory for LinearMemory {
    fn end(&self) -> usize {
        core::arch::wasm32::memory_size(0) * PAGE
    }

    fn grow(&mut self, pages: usize) -> Option<usize> {
        match core::arch::wasm32::memory_grow(0, pages) {
            usize::MAX => None,
            previous => Some(previous * PAGE),
        }
    }

    /// What the initial memory has free above the data (`__heap_base`),
    /// less [`LIBC_SLACK`], taken as one block from the C library's
    /// allocator: it owns that stretch (wasi-libc's dlmalloc adds it to its
    /// heap when it starts), so taking it through it keeps the two heaps
    /// apart. `None` when too little is free.
    fn first(&mut self) -> Option<(usize, usize)> {
        unsafe extern "C" {
            static __heap_base: u8;
        }
        let base = (&raw const __heap_base) as usize;
        first_stretch(base, self.end())
    }
}

/// The stretch above `base` (`__heap_base`) in a memory that ends at `end`
/// taken through wasi-libc's allocator (see [`LinearMemory::first`]).
#[cfg(all(target_arch = "wasm32", target_os = "wasi"))]
fn first_stretch(base: usize, end: usize) -> Option<(usize, usize)> {
    let free = end.checked_sub(base)?.checked_sub(LIBC_SLACK)?;
    let size = free & !(PAGE - 1);
    if size == 0 {
        return None;
    }
    let layout = Layout::from_size_align(size, ALIGN).ok()?;
    // SAFETY: a non-zero size; the block is never freed.
    let p = unsafe { std::alloc::GlobalAlloc::alloc(&std::alloc::System, layout) };
    (!p.is_null()).then(|| (p as usize, p as usize + size))
}

/// Without a C library (`wasm32-unknown-unknown`) nothing else owns the
/// stretch above `__heap_base`: the standard library's allocator there
/// takes only memory it grows, and it is not the global allocator.
#[cfg(all(target_arch = "wasm32", not(target_os = "wasi")))]
fn first_stretch(base: usize, end: usize) -> Option<(usize, usize)> {
    (end > base).then_some((base, end))
}

/// What the heap leaves of the initial memory to the C library's allocator.
#[cfg(all(target_arch = "wasm32", target_os = "wasi"))]
const LIBC_SLACK: usize = PAGE;

/// The global allocator of a component.
#[cfg(target_arch = "wasm32")]
pub(crate) struct CallArena(core::cell::UnsafeCell<Heap<LinearMemory>>);

// SAFETY: only compiled for wasm without the `atomics` target feature: one
// thread, so the heap is never touched from two threads at once.
#[cfg(target_arch = "wasm32")]
unsafe impl Sync for CallArena {}

#[cfg(target_arch = "wasm32")]
impl CallArena {
    /// An empty heap; memory is taken on first use (see [`Memory::first`]).
    pub(crate) const fn new() -> Self {
        CallArena(core::cell::UnsafeCell::new(Heap::new(LinearMemory)))
    }
}

// SAFETY: single thread (see `Sync`) and no allocation re-enters, so the
// exclusive borrow of the heap is unique; the heap hands out disjoint
// blocks of at least the requested size and alignment.
#[cfg(target_arch = "wasm32")]
unsafe impl core::alloc::GlobalAlloc for CallArena {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see above.
        unsafe { (*self.0.get()).alloc(layout) }
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        // SAFETY: see above.
        unsafe { (*self.0.get()).dealloc(p, layout) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: see above.
        unsafe { (*self.0.get()).realloc(p, layout, new_size) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A memory of at most `cap` bytes inside a host buffer; `intrude`
    /// grows it by a page behind the heap's back (as the C library's own
    /// allocator may) before every `n`-th growth.
    struct Fake {
        buffer: Vec<u128>,
        len: usize,
        grows: usize,
        intrude_every: Option<usize>,
        /// The first stretch offered, as offsets: `8..first` (unaligned
        /// start), with a page above it that is not the heap's.
        first: usize,
    }

    impl Fake {
        fn new(cap: usize) -> Self {
            Fake {
                buffer: vec![0; cap / 16],
                len: 0,
                grows: 0,
                intrude_every: None,
                first: 0,
            }
        }
        fn with_first(cap: usize, first: usize) -> Self {
            Fake {
                len: first + PAGE,
                first,
                ..Fake::new(cap)
            }
        }
        fn base(&self) -> usize {
            self.buffer.as_ptr() as usize
        }
        fn cap(&self) -> usize {
            self.buffer.len() * 16
        }
    }

    impl Memory for Fake {
        fn end(&self) -> usize {
            self.base() + self.len
        }
        fn grow(&mut self, pages: usize) -> Option<usize> {
            self.grows += 1;
            if let Some(n) = self.intrude_every
                && self.grows.is_multiple_of(n)
                && self.len + PAGE <= self.cap()
            {
                self.len += PAGE;
            }
            let bytes = pages.checked_mul(PAGE)?;
            if self.len.checked_add(bytes)? > self.cap() {
                return None;
            }
            let start = self.end();
            self.len += bytes;
            Some(start)
        }
        fn first(&mut self) -> Option<(usize, usize)> {
            (self.first > 0).then(|| (self.base() + 8, self.base() + self.first))
        }
    }

    /// A live block and the byte it is filled with.
    struct Block {
        p: *mut u8,
        layout: Layout,
        fill: u8,
    }

    fn fill(b: &Block) {
        // SAFETY: the block is live and `layout.size()` long.
        unsafe { ptr::write_bytes(b.p, b.fill, b.layout.size()) };
    }

    fn check(heap: &Heap<Fake>, live: &[Block]) {
        let (lo, hi) = (heap.memory.base(), heap.memory.end());
        let mut spans: Vec<(usize, usize)> = live
            .iter()
            .map(|b| {
                let start = b.p as usize;
                assert_eq!(start % b.layout.align(), 0, "aligned");
                assert!(start >= lo && start + b.layout.size() <= hi, "inside");
                // SAFETY: the block is live.
                let bytes = unsafe { std::slice::from_raw_parts(b.p, b.layout.size()) };
                assert!(bytes.iter().all(|&x| x == b.fill), "contents kept");
                (start, start + b.layout.size())
            })
            .collect();
        spans.sort_unstable();
        for w in spans.windows(2) {
            assert!(w[0].1 <= w[1].0, "blocks overlap: {w:?}");
        }
    }

    /// A deterministic pseudo-random sequence.
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self, n: usize) -> usize {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((self.0 >> 33) as usize) % n
        }
    }

    fn random_size(r: &mut Lcg) -> usize {
        match r.next(10) {
            0 => 65_000 + r.next(100_000),
            1..=2 => 1 + r.next(8_000),
            _ => 1 + r.next(200),
        }
    }

    fn churn(mut heap: Heap<Fake>, seed: u64, steps: usize) -> Heap<Fake> {
        let mut r = Lcg(seed);
        let mut live: Vec<Block> = Vec::new();
        for step in 0..steps {
            match r.next(8) {
                0..=3 => {
                    let align = [1, 8, 16, 64][r.next(4)];
                    let layout = Layout::from_size_align(random_size(&mut r), align).unwrap();
                    // SAFETY: non-zero size.
                    let p = unsafe { heap.alloc(layout) };
                    assert!(!p.is_null(), "step {step}: the fake memory is large enough");
                    let b = Block {
                        p,
                        layout,
                        fill: (step % 251) as u8,
                    };
                    fill(&b);
                    live.push(b);
                }
                4..=5 if !live.is_empty() => {
                    let b = live.swap_remove(r.next(live.len()));
                    // SAFETY: allocated here with this layout.
                    unsafe { heap.dealloc(b.p, b.layout) };
                }
                6..=7 if !live.is_empty() => {
                    let i = r.next(live.len());
                    let new_size = random_size(&mut r);
                    let b = &mut live[i];
                    // SAFETY: allocated here with this layout; non-zero size.
                    let q = unsafe { heap.realloc(b.p, b.layout, new_size) };
                    assert!(!q.is_null());
                    let kept = b.layout.size().min(new_size);
                    // SAFETY: `q` holds at least `new_size` bytes.
                    let bytes = unsafe { std::slice::from_raw_parts(q, kept) };
                    assert!(
                        bytes.iter().all(|&x| x == b.fill),
                        "realloc keeps the prefix"
                    );
                    b.p = q;
                    b.layout = Layout::from_size_align(new_size, b.layout.align()).unwrap();
                    fill(b);
                }
                _ => {}
            }
            if step % 64 == 0 {
                check(&heap, &live);
            }
        }
        check(&heap, &live);
        heap
    }

    #[test]
    fn blocks_never_overlap_and_keep_their_contents() {
        for seed in 0..4 {
            churn(Heap::new(Fake::new(64 << 20)), seed, 1_500);
        }
    }

    #[test]
    fn the_first_stretch_is_used_before_the_memory_grows() {
        let first = 10 * PAGE;
        let mut heap = Heap::new(Fake::with_first(64 << 20, first));
        let base = heap.memory.base();
        let small = Layout::from_size_align(100, 8).unwrap();
        // SAFETY: non-zero size.
        let p = unsafe { heap.alloc(small) } as usize;
        assert_eq!(
            p,
            base + 16,
            "the first block, aligned, at the stretch's start"
        );
        // Blocks that fit the stretch do not grow the memory.
        let mut taken = vec![p];
        let block = Layout::from_size_align(PAGE, 8).unwrap();
        for _ in 0..8 {
            // SAFETY: non-zero size.
            taken.push(unsafe { heap.alloc(block) } as usize);
        }
        assert_eq!(heap.memory.grows, 0);
        assert!(taken.iter().all(|&q| q >= base + 16 && q < base + first));
        // One that does not fit comes from new pages above the page that
        // is not the heap's, and the memory grows.
        let big = Layout::from_size_align(2 * PAGE, 8).unwrap();
        // SAFETY: non-zero size.
        let q = unsafe { heap.alloc(big) } as usize;
        assert_eq!(heap.memory.grows, 1);
        assert!(
            q >= base + first + PAGE,
            "{q:#x} above {:#x}",
            base + first + PAGE
        );
        // Churn over a heap that started in its own stretch keeps every
        // block apart and intact.
        churn(Heap::new(Fake::with_first(64 << 20, first)), 11, 1_500);
    }

    #[test]
    fn growth_by_someone_else_starts_a_new_stretch_of_heap() {
        let mut fake = Fake::new(64 << 20);
        fake.intrude_every = Some(2);
        let heap = churn(Heap::new(fake), 7, 1_500);
        assert!(heap.memory.grows > 2);
    }

    #[test]
    fn freed_blocks_are_reused_so_churn_does_not_grow_the_memory() {
        let mut heap = Heap::new(Fake::new(4 << 20));
        let sizes = [24, 100, 3_000, 70_000, 200_000];
        for round in 0..1_000 {
            let blocks: Vec<_> = sizes
                .iter()
                .map(|&n| {
                    let layout = Layout::from_size_align(n, 8).unwrap();
                    // SAFETY: non-zero size.
                    let p = unsafe { heap.alloc(layout) };
                    assert!(!p.is_null(), "round {round}");
                    (p, layout)
                })
                .collect();
            // Freed in allocation order: most are not at the top.
            for (p, layout) in blocks {
                // SAFETY: allocated here with this layout.
                unsafe { heap.dealloc(p, layout) };
            }
        }
        assert!(heap.memory.len <= 1 << 20, "{} bytes", heap.memory.len);
    }

    #[test]
    fn a_buffer_growing_at_the_top_is_extended_in_place() {
        let mut heap = Heap::new(Fake::new(16 << 20));
        let mut layout = Layout::from_size_align(8, 1).unwrap();
        // SAFETY: non-zero size.
        let first = unsafe { heap.alloc(layout) };
        let mut p = first;
        while layout.size() < 4 << 20 {
            let new_size = layout.size() * 2;
            // SAFETY: allocated here with `layout`.
            p = unsafe { heap.realloc(p, layout, new_size) };
            layout = Layout::from_size_align(new_size, 1).unwrap();
            if new_size <= 1 << MAX_SHIFT {
                assert_eq!(p, first, "small: grown in place");
            }
        }
        // One copy, from the largest small class to the first large block.
        assert_eq!(p as usize, first as usize + (1 << MAX_SHIFT) + HEADER);
        assert!(heap.memory.len < (4 << 20) + (1 << MAX_SHIFT) + 2 * PAGE);
    }

    #[test]
    fn a_refused_growth_is_an_allocation_failure_and_the_heap_stays_usable() {
        let mut heap = Heap::new(Fake::new(1 << 20));
        let big = Layout::from_size_align(300_000, 8).unwrap();
        let mut held = Vec::new();
        loop {
            // SAFETY: non-zero size.
            let p = unsafe { heap.alloc(big) };
            if p.is_null() {
                break;
            }
            held.push(p);
        }
        assert_eq!(held.len(), 3);
        assert!(heap.memory.len <= 1 << 20);
        // SAFETY: allocated here with `big`.
        unsafe { heap.dealloc(held[0], big) };
        // SAFETY: non-zero size.
        let again = unsafe { heap.alloc(big) };
        assert_eq!(again, held[0], "the freed block is reused");
        let huge = Layout::from_size_align(usize::MAX / 2, 1).unwrap();
        // SAFETY: non-zero size.
        assert!(unsafe { heap.alloc(huge) }.is_null());
    }
}
