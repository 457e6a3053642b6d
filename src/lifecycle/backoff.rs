//! Retry delays: exponential with "equal jitter" (half fixed, half random), so that many
//! workers retrying after one outage spread out instead of returning together.

use std::time::Duration;

/// The wait before retrying after `attempts` failed attempts (1 for the first failure):
/// `base * 2^(attempts-1)`, capped at `max`, of which the second half is scaled by `unit`
/// (a number in [0, 1), random in use).
pub fn retry_delay(attempts: u32, base: Duration, max: Duration, unit: f64) -> Duration {
    let exp = attempts.saturating_sub(1).min(30);
    let full = base.saturating_mul(1u32 << exp).min(max);
    let unit = unit.clamp(0.0, 1.0);
    full / 2 + (full / 2).mul_f64(unit)
}

/// A number in [0, 1) that differs between calls, processes and documents: jitter needs no
/// cryptographic randomness, only spread.
pub fn jitter_unit(salt: &str) -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut h = blake3::Hasher::new();
    h.update(&nanos.to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    h.update(salt.as_bytes());
    let b = h.finalize();
    let x = u64::from_le_bytes(b.as_bytes()[..8].try_into().expect("8 bytes"));
    (x >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn delays_grow_stay_within_bounds_and_jitter_by_at_most_half(
            attempts in 1u32..40,
            base_ms in 1u64..5_000,
            max_ms in 1u64..600_000,
            unit in 0.0f64..1.0,
        ) {
            let (base, max) = (Duration::from_millis(base_ms), Duration::from_millis(max_ms));
            let d = retry_delay(attempts, base, max, unit);
            let full = base.saturating_mul(1u32 << (attempts - 1).min(30)).min(max);
            prop_assert!(d >= full / 2 && d <= full, "{d:?} outside [{:?}, {full:?}]", full / 2);
            prop_assert!(d <= max);
            // The fixed half never shrinks as attempts grow.
            let next = retry_delay(attempts + 1, base, max, 0.0);
            prop_assert!(next >= retry_delay(attempts, base, max, 0.0));
        }
    }

    #[test]
    fn doubles_until_the_cap() {
        let b = Duration::from_secs(1);
        let m = Duration::from_secs(10);
        let no_jitter = |a| retry_delay(a, b, m, 1.0);
        assert_eq!(no_jitter(1), Duration::from_secs(1));
        assert_eq!(no_jitter(2), Duration::from_secs(2));
        assert_eq!(no_jitter(4), Duration::from_secs(8));
        assert_eq!(no_jitter(5), Duration::from_secs(10));
        let u = jitter_unit("doc");
        assert!((0.0..1.0).contains(&u));
    }
}
