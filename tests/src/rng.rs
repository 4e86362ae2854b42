//! A small seeded random number generator for fault and crash tests: a fixed seed makes a
//! failing round reproducible, and no crate is needed for it.

/// xorshift64*. The seed must not be 0.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// A number in `0..bound`.
    pub fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % bound
    }
}
