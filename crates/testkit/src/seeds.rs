//! Seeds of the simulation tests, and replaying one.
//!
//! A seeded test runs a list of seeds: `IRONRAID_SEED` alone when set (a replay), else a count
//! (its default, or the test family's variable such as `IRONRAID_CRASH_CASES`) of consecutive
//! seeds from a base (the family's, or `IRONRAID_SEED_BASE`). When a seed fails, the test prints
//! the command that replays it, then fails:
//!
//! ```no_run
//! testkit::for_each_seed!("my_test", testkit::Seeds::sim(20), |seed| {
//!     assert!(seed > 0);
//! });
//! ```

/// Replays one seed: when set, a seeded test runs this seed and no other.
pub const SEED: &str = "IRONRAID_SEED";

/// Where the consecutive seeds start, instead of the test family's base (a long run explores
/// other seeds with it).
pub const SEED_BASE: &str = "IRONRAID_SEED_BASE";

/// Which seeds a test runs when no seed is replayed: `count` from `base`, unless the
/// environment says otherwise (`count_var`, [`SEED_BASE`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seeds {
    /// The environment variable that overrides `count` for this family of tests.
    pub count_var: &'static str,
    pub count: u64,
    pub base: u64,
}

impl Seeds {
    /// The simulation tests' seeds: `count` of them (`IRONRAID_SIM_CASES` overrides), from 0x5eed.
    pub fn sim(count: u64) -> Seeds {
        Seeds {
            count_var: "IRONRAID_SIM_CASES",
            count,
            base: 0x5eed,
        }
    }

    /// The crash simulation's seeds: 1000 (`IRONRAID_CRASH_CASES` overrides), from 0xc0ffee.
    pub fn crash() -> Seeds {
        Seeds {
            count_var: "IRONRAID_CRASH_CASES",
            count: 1000,
            base: 0xc0ffee,
        }
    }

    /// The integrity fault tests' seeds: 300 (`IRONRAID_INTEGRITY_CASES` overrides), from
    /// `base` (each test its own, so that they explore different seeds).
    pub fn integrity(base: u64) -> Seeds {
        Seeds {
            count_var: "IRONRAID_INTEGRITY_CASES",
            count: 300,
            base,
        }
    }

    /// At most `most` seeds by default (the count variable still overrides): for a test whose
    /// every case is costly.
    pub fn at_most(self, most: u64) -> Seeds {
        Seeds {
            count: self.count.min(most),
            ..self
        }
    }

    /// The seeds to run.
    pub fn list(&self) -> Vec<u64> {
        if let Some(seed) = env_number(SEED) {
            return vec![seed];
        }
        let count = env_number(self.count_var).unwrap_or(self.count);
        let base = env_number(SEED_BASE).unwrap_or(self.base);
        (0..count).map(|i| base.wrapping_add(i)).collect()
    }
}

/// A variable that is set must hold a number: a typo must not silently run the defaults.
fn env_number(var: &str) -> Option<u64> {
    let value = std::env::var(var).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{var} must be a number, not '{value}'")),
    )
}

/// Where a failing seed is replayed: the package and test binary (the caller's, which
/// [`for_each_seed!`](crate::for_each_seed) fills in) and the test's name.
#[derive(Clone, Copy, Debug)]
pub struct Replay<'a> {
    pub package: &'a str,
    pub binary: &'a str,
    pub test: &'a str,
}

/// Run `case` for every seed of `seeds`; when one panics, print which seed and the command that
/// replays it, and panic on with the same payload. Use it through
/// [`for_each_seed!`](crate::for_each_seed), which names the caller's package and binary.
pub fn run_each(replay: Replay, seeds: Seeds, case: impl Fn(u64)) {
    for seed in seeds.list() {
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(seed)));
        if let Err(e) = res {
            eprintln!(
                "\n*** {test} failed with seed {seed}; replay with:\n    {SEED}={seed} cargo test -p {package} --release --test {binary} -- {test} --exact --nocapture\n",
                test = replay.test,
                package = replay.package,
                binary = replay.binary,
            );
            std::panic::resume_unwind(e);
        }
    }
}

/// `for_each_seed!(test_name, seeds, |seed| ...)`: [`run_each`] for the calling test binary.
#[macro_export]
macro_rules! for_each_seed {
    ($test:expr, $seeds:expr, $case:expr $(,)?) => {
        $crate::seeds::run_each(
            $crate::seeds::Replay {
                package: env!("CARGO_PKG_NAME"),
                binary: env!("CARGO_CRATE_NAME"),
                test: $test,
            },
            $seeds,
            $case,
        )
    };
}

#[cfg(test)]
mod tests {
    use super::{run_each, Replay, Seeds};

    /// Canary: a seed that fails fails the test (the replay line is printed, the panic goes on).
    #[test]
    fn a_failing_seed_fails_the_run() {
        let replay = Replay {
            package: "testkit",
            binary: "seeds",
            test: "a_failing_seed_fails_the_run",
        };
        let seeds = Seeds::sim(3);
        let failed = std::panic::catch_unwind(|| run_each(replay, seeds, |_| panic!("bad seed")));
        assert!(failed.is_err(), "a panicking case passed");
        run_each(replay, seeds, |_| {});
    }

    #[test]
    fn consecutive_seeds_from_the_base_and_capped_by_at_most() {
        // The environment of a test run may replay a seed; this test reads only the plan.
        let s = Seeds::integrity(100).at_most(3);
        assert_eq!((s.count, s.base), (3, 100));
        assert_eq!(Seeds::crash().at_most(5000).count, 1000);
    }
}
