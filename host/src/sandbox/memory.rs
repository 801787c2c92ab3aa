//! One memory cap per store: the sum of every linear memory and table
//! ([`MemoryCap`]).
//!
//! # Guarantees
//! - Creating a memory or table counts as growth from zero, so no store
//!   holds more than its cap whatever the number of memories it makes.
//! - A table never grows past a fixed number of elements.
//! - A refused growth is remembered, so the call is reported as out of
//!   memory rather than as the trap the guest turns it into.

/// One cap for the sum of every linear memory and table of a store (their
/// creation counts as growth from zero), remembering whether it was hit so
/// an allocation failure can be reported as "out of memory" rather than as
/// the trap the guest turns it into.
pub(super) struct MemoryCap {
    pub(super) bytes: usize,
    pub(super) used: usize,
    pub(super) hit: bool,
}

/// Table growth beyond this many elements is refused (per table).
pub(super) const MAX_TABLE_ELEMENTS: usize = 100_000;

/// What one table element costs against the cap.
pub(super) const TABLE_ELEMENT_BYTES: usize = std::mem::size_of::<usize>();

impl MemoryCap {
    /// Accounts growth from `current` to `desired` bytes, or refuses it.
    fn grow(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> bool {
        // Growth past the object's own maximum fails anyway; do not count it.
        if maximum.is_some_and(|max| desired > max) {
            return false;
        }
        let more = desired.saturating_sub(current);
        match self.used.checked_add(more) {
            Some(total) if total <= self.bytes => {
                self.used = total;
                true
            }
            _ => {
                self.hit = true;
                false
            }
        }
    }
}

impl wasmtime::ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.grow(current, desired, maximum))
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            return Ok(false);
        }
        let bytes = |elements: usize| elements.saturating_mul(TABLE_ELEMENT_BYTES);
        Ok(self.grow(bytes(current), bytes(desired), maximum.map(bytes)))
    }

    fn instances(&self) -> usize {
        32
    }

    fn tables(&self) -> usize {
        32
    }

    fn memories(&self) -> usize {
        4
    }
}
