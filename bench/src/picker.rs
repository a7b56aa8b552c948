//! What attempt `i` of a workload sends: user, quantity and request id.
//!
//! Pure and deterministic: attempt `i` is a function of `(seed, i)` alone. Each
//! attempt draws from its own small RNG seeded from the workload's seed and its
//! index, rather than from one RNG per client task, because clients pull
//! indices from a shared counter in whatever order the scheduler allows; seeding
//! per index keeps the set of attempts identical from run to run and from one
//! concurrency to another, so two strategies face exactly the same buyers.
//!
//! A retry (a `retry_rate` share of attempts) re-sends an earlier attempt `j < i`
//! with its request id, user and quantity — the client that lost an answer and
//! tries again. If `j` was itself a retry, the chain is followed to the attempt
//! that first sent the id, so every retry repeats an id that was really used.

use rand::distr::Distribution;
use rand::distr::weighted::WeightedIndex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::Zipf;

use crate::{BenchError, Workload};

/// One purchase attempt, as generated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// `u<n>` for user number n in `0..users`.
    pub user: String,
    pub qty: u32,
    /// `r<seed hex>-<index of the attempt that first sent it>`.
    pub request_id: String,
    /// The index of the attempt whose id this one re-sends, for a retry.
    pub retry_of: Option<u64>,
}

/// How users are drawn.
#[derive(Debug, Clone, Copy)]
enum Users {
    Uniform(u64),
    Zipf(Zipf<f64>, u64),
}

/// Generates the attempts of one workload.
#[derive(Debug, Clone)]
pub struct Picker {
    seed: u64,
    users: Users,
    quantities: Vec<u32>,
    weights: WeightedIndex<f64>,
    retry_rate: f64,
}

impl Picker {
    /// Checks the workload and prepares its distributions.
    pub fn new(w: &Workload) -> Result<Self, BenchError> {
        w.validate()?;
        let users = match w.zipf {
            None => Users::Uniform(w.users),
            Some(s) => Users::Zipf(
                Zipf::new(w.users as f64, s)
                    .map_err(|e| BenchError::Workload(format!("Zipf: {e}")))?,
                w.users,
            ),
        };
        let weights = WeightedIndex::new(w.quantities.iter().map(|&(_, weight)| weight))
            .map_err(|e| BenchError::Workload(format!("quantity mix: {e}")))?;
        Ok(Self {
            seed: w.seed,
            users,
            quantities: w.quantities.iter().map(|&(q, _)| q).collect(),
            weights,
            retry_rate: w.retry_rate,
        })
    }

    /// Attempt number `i` (0-based).
    pub fn attempt(&self, i: u64) -> Attempt {
        let mut origin = i;
        loop {
            let mut rng = self.rng(origin);
            // Always drawn, so the draws after it do not depend on `origin`.
            let retry = rng.random_bool(self.retry_rate);
            if retry && origin > 0 {
                origin = rng.random_range(0..origin);
                continue;
            }
            return Attempt {
                user: format!("u{}", self.user(&mut rng)),
                qty: self.quantities[self.weights.sample(&mut rng)],
                request_id: format!("r{:x}-{origin}", self.seed),
                retry_of: (origin != i).then_some(origin),
            };
        }
    }

    /// User number in `0..users`.
    pub fn user(&self, rng: &mut SmallRng) -> u64 {
        match self.users {
            Users::Uniform(n) => rng.random_range(0..n),
            // Zipf samples ranks 1..=n as floats; rank 1 is user 0.
            Users::Zipf(zipf, n) => (zipf.sample(rng) as u64).clamp(1, n) - 1,
        }
    }

    fn rng(&self, i: u64) -> SmallRng {
        // An odd multiplier spreads neighbouring indices over the seed space.
        SmallRng::seed_from_u64(self.seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(zipf: Option<f64>, retry_rate: f64) -> Workload {
        Workload {
            users: 100,
            zipf,
            retry_rate,
            quantities: vec![(1, 0.8), (2, 0.15), (3, 0.05)],
            seed: 7,
            ..Workload::default()
        }
    }

    fn user_counts(p: &Picker, n: u64, users: usize) -> Vec<u64> {
        let mut counts = vec![0u64; users];
        for i in 0..n {
            let a = p.attempt(i);
            let k: usize = a.user[1..].parse().unwrap();
            counts[k] += 1;
        }
        counts
    }

    #[test]
    fn the_same_seed_gives_the_same_attempts_and_another_seed_others() {
        let w = workload(Some(1.1), 0.1);
        let a = Picker::new(&w).unwrap();
        let b = Picker::new(&w).unwrap();
        let c = Picker::new(&Workload { seed: 8, ..w }).unwrap();
        let run = |p: &Picker| (0..500).map(|i| p.attempt(i)).collect::<Vec<_>>();
        assert_eq!(run(&a), run(&b));
        assert_ne!(run(&a), run(&c));
        // Order of generation does not matter: attempt i is a pure function.
        assert_eq!(a.attempt(321), b.attempt(321));
    }

    #[test]
    fn uniform_users_are_spread_evenly() {
        let p = Picker::new(&workload(None, 0.0)).unwrap();
        let counts = user_counts(&p, 100_000, 100);
        // 1,000 expected per user; 5 standard deviations is ~160.
        for (user, &c) in counts.iter().enumerate() {
            assert!((840..=1160).contains(&c), "user {user}: {c}");
        }
    }

    #[test]
    fn zipf_users_follow_their_rank() {
        let s = 1.0;
        let p = Picker::new(&workload(Some(s), 0.0)).unwrap();
        let counts = user_counts(&p, 100_000, 100);
        // P(rank k) ∝ 1/k: user 0 twice as often as user 1, ten times user 9.
        let ratio = |a: usize, b: usize| counts[a] as f64 / counts[b] as f64;
        assert!((1.8..2.2).contains(&ratio(0, 1)), "{counts:?}");
        assert!((8.0..12.5).contains(&ratio(0, 9)), "{counts:?}");
        // H(100) ≈ 5.187, so user 0 gets ~19.3%.
        assert!((18_000..20_600).contains(&counts[0]), "{}", counts[0]);
        assert!(counts[99] > 0);
    }

    #[test]
    fn the_quantity_mix_is_respected() {
        let p = Picker::new(&workload(None, 0.0)).unwrap();
        let mut by_qty = [0u64; 4];
        for i in 0..100_000 {
            by_qty[p.attempt(i).qty as usize] += 1;
        }
        assert_eq!(by_qty[0], 0);
        assert!((79_000..81_000).contains(&by_qty[1]), "{by_qty:?}");
        assert!((14_200..15_800).contains(&by_qty[2]), "{by_qty:?}");
        assert!((4_500..5_500).contains(&by_qty[3]), "{by_qty:?}");
    }

    #[test]
    fn retries_resend_an_earlier_attempt_exactly() {
        let p = Picker::new(&workload(Some(0.8), 0.2)).unwrap();
        let n = 20_000;
        let mut retries = 0;
        for i in 0..n {
            let a = p.attempt(i);
            match a.retry_of {
                None => assert_eq!(a.request_id, format!("r7-{i}")),
                Some(j) => {
                    retries += 1;
                    assert!(j < i);
                    let original = p.attempt(j);
                    assert_eq!(original.retry_of, None, "the chain ends at a fresh attempt");
                    assert_eq!((a.user, a.qty, a.request_id), {
                        let o = original;
                        (o.user, o.qty, o.request_id)
                    });
                }
            }
        }
        assert!((3_700..4_300).contains(&retries), "{retries} retries");
    }

    #[test]
    fn without_retries_every_request_id_is_unique() {
        let p = Picker::new(&workload(None, 0.0)).unwrap();
        let ids: std::collections::HashSet<_> =
            (0..5_000).map(|i| p.attempt(i).request_id).collect();
        assert_eq!(ids.len(), 5_000);
    }
}
