//! Routing: which bucket is a user's home, and in which order the ring is probed.
//!
//! The hash is XXH3-64 with seed 0 over the user id's UTF-8 bytes: a published,
//! frozen algorithm (not `std`'s `DefaultHasher`, whose output may change between
//! Rust releases), so every instance and every version routes a user to the same
//! bucket. `home = hash % buckets`. The unit tests pin known values: if they
//! ever change, routing changed, and live events would lose track of their users.

use crate::domain::ids::UserId;

/// The stable 64-bit routing hash of a user id.
pub fn user_hash(user: &UserId) -> u64 {
    hash_bytes(user.as_str().as_bytes())
}

/// XXH3-64, seed 0.
pub(crate) fn hash_bytes(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// The home bucket of a user hash among `buckets` buckets.
pub fn home(hash: u64, buckets: u32) -> u32 {
    debug_assert!(buckets > 0);
    (hash % u64::from(buckets)) as u32
}

/// The probe order after the home bucket is short: `home+1, home+2, …` around
/// the whole ring, ending with the home bucket itself (which may have been
/// refilled by a consolidation or a cancel since the home step).
pub fn ring(home: u32, buckets: u32) -> impl Iterator<Item = u32> {
    (1..=buckets).map(move |i| (home + i) % buckets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_routing_hash_is_pinned() {
        // XXH3-64 of "" is the algorithm's published reference value; the others
        // pin this build. If any changes, live events lose track of their users.
        assert_eq!(hash_bytes(b""), 0x2d06_8005_38d3_94c2);
        let u = |s: &str| user_hash(&UserId::parse(s).unwrap());
        assert_eq!(u("u-1001"), 0x1075_be2c_4caa_7a89);
        assert_eq!(u("alice"), 0x4da1_0dd6_1a01_16b0);
        assert_eq!(u("u-1"), 0xea72_db3c_4998_47f0);
        assert_eq!(home(u("u-1001"), 16), 9);
        assert_eq!(
            home(u("alice"), 10),
            0x4da1_0dd6_1a01_16b0_u64.rem_euclid(10) as u32
        );
    }

    #[test]
    fn the_ring_visits_every_other_bucket_then_home() {
        assert_eq!(ring(2, 4).collect::<Vec<_>>(), vec![3, 0, 1, 2]);
        assert_eq!(ring(0, 1).collect::<Vec<_>>(), vec![0]);
    }

    #[test]
    fn users_spread_over_buckets() {
        let mut counts = [0u32; 16];
        for i in 0..16_000 {
            let user = UserId::parse(format!("u-{i}")).unwrap();
            counts[home(user_hash(&user), 16) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }
}
