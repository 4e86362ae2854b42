//! Text without an allocator, for the shim: its command line as it came from the kernel
//! ([`Argv`]), numbers, and lines built in a fixed buffer ([`Line`]).

use core::ffi::CStr;
use core::fmt;

/// A null-terminated array of NUL-terminated strings (a process's `argv` or `envp`), which
/// lives as long as the process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Argv<'a> {
    ptr: *const *const u8,
    len: usize,
    strings: core::marker::PhantomData<&'a CStr>,
}

impl<'a> Argv<'a> {
    /// # Safety
    ///
    /// `ptr` points to a null-terminated array of NUL-terminated strings that live, unchanged,
    /// for `'a`.
    pub(crate) unsafe fn new(ptr: *const *const u8) -> Argv<'a> {
        let mut len = 0;
        // SAFETY: the array is null-terminated (the caller's promise).
        while !unsafe { *ptr.add(len) }.is_null() {
            len += 1;
        }
        Argv { ptr, len, strings: core::marker::PhantomData }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The entry at `index`.
    pub(crate) fn get(&self, index: usize) -> Option<&'a CStr> {
        // SAFETY: `index < len`, and each entry is NUL-terminated (`new`'s promise).
        (index < self.len).then(|| unsafe { CStr::from_ptr((*self.ptr.add(index)).cast()) })
    }

    /// The entries from `index` on, as a null-terminated array (for `execve`).
    pub(crate) fn tail(&self, index: usize) -> *const *const u8 {
        // SAFETY: at most one past the last entry: the terminating null.
        unsafe { self.ptr.add(index.min(self.len)) }
    }
}

/// A decimal number (digits only), if it fits.
pub(crate) fn parse_u64(text: &[u8]) -> Option<u64> {
    if text.is_empty() {
        return None;
    }
    text.iter().try_fold(0u64, |n, &b| {
        b.is_ascii_digit().then_some(())?;
        n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

/// A line of text built in a fixed buffer; what does not fit is cut off.
pub(crate) struct Line<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> Line<N> {
    pub(crate) fn new() -> Self {
        Line { buf: [0; N], len: 0 }
    }

    pub(crate) fn push(&mut self, bytes: &[u8]) -> &mut Self {
        let n = bytes.len().min(N - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
        self
    }

    /// Replaces every byte `from` with `to`.
    pub(crate) fn replace(&mut self, from: u8, to: u8) {
        self.buf[..self.len].iter_mut().filter(|b| **b == from).for_each(|b| *b = to);
    }

    /// Cuts the text to at most `len` bytes.
    pub(crate) fn truncate(&mut self, len: usize) -> &mut Self {
        self.len = self.len.min(len);
        self
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The text with a NUL after it, for a system call; `None` if it holds a NUL or fills the
    /// buffer (it was cut off).
    pub(crate) fn c_str(&mut self) -> Option<&CStr> {
        if self.len >= N || self.bytes().contains(&0) {
            return None;
        }
        self.buf[self.len] = 0;
        CStr::from_bytes_with_nul(&self.buf[..=self.len]).ok()
    }
}

impl<const N: usize> fmt::Write for Line<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push(s.as_bytes());
        Ok(())
    }
}

impl<const N: usize> fmt::Debug for Line<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(core::str::from_utf8(self.bytes()).unwrap_or("<bytes>"), f)
    }
}

/// Bytes shown as text, lossily (a path in a message).
pub(crate) struct Lossy<'a>(pub(crate) &'a [u8]);

impl fmt::Display for Lossy<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for chunk in self.0.utf8_chunks() {
            f.write_str(chunk.valid())?;
            if !chunk.invalid().is_empty() {
                f.write_str("\u{fffd}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt::Write;

    #[test]
    fn numbers_parse_strictly() {
        for (text, expected) in [
            ("0", Some(0)),
            ("1048576", Some(1 << 20)),
            ("18446744073709551615", Some(u64::MAX)),
            ("18446744073709551616", None),
            ("", None),
            ("-1", None),
            ("1x", None),
            (" 1", None),
        ] {
            assert_eq!(parse_u64(text.as_bytes()), expected, "{text:?}");
        }
    }

    #[test]
    fn lines_cut_what_does_not_fit() {
        let mut line = Line::<8>::new();
        write!(line, "ab{}", 42).unwrap();
        assert_eq!(line.c_str().unwrap(), c"ab42");
        line.push(b"56789");
        assert_eq!(line.bytes(), b"ab425678");
        assert_eq!(line.c_str(), None, "a full buffer has no room for the NUL");
        let mut with_nul = Line::<8>::new();
        assert_eq!(with_nul.push(b"a\0b").c_str(), None);
        assert_eq!(Lossy(b"a\xffb").to_string(), "a\u{fffd}b");
    }
}
