//! The engine tests' simulation harness (a `[dev-dependencies]` entry only; never published):
//! arrays built over `device::SimDevice` members, a seeded workload, and checks read from the
//! member images. It sits above `engine`; what needs no engine (the independent md oracle, the
//! crash model, seeds and their replay) is in `testkit`, below every crate.
//!
//! - [`array`]: [`sim_array`] creates (clean) and assembles an array of simulated members;
//!   [`create_clean`] / [`clean_spec`] for tests that build their own; [`devs`], [`config`],
//!   [`reassemble`] / [`reassemble_with`]; [`settle`] runs background work to its end;
//! - [`geometries`]: [`all_geometries`], every level and layout with a member count;
//! - [`redundancy`]: [`check_redundancy`] / [`redundancy_error`] (/ [`redundancy_error_in`]
//!   without an array), parity and copies as the engine's geometry places them;
//! - [`workload`]: [`run_workload`] and the [`DiskModel`] it checks reads against;
//! - [`records`]: the integrity fault tests' faults and arrays with records;
//! - [`cluster`]: [`cluster::SlotNode`], a cluster node that knows only its bitmap slot.
//!
//! A seeded test over it:
//!
//! ```no_run
//! use simkit::{run_workload, sim_array, DiskModel};
//! use rand::SeedableRng;
//!
//! testkit::for_each_seed!("workload", testkit::Seeds::sim(6), |seed| {
//!     let sa = sim_array(layout::Level::Raid5, Some(2), 4, 64 << 10, 4 << 20, seed);
//!     let mut model = DiskModel::new(sa.array.size_bytes());
//!     let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
//!     run_workload(&sa, &mut model, &mut rng, 60, &[]);
//!     model.check_array(&sa.array);
//!     simkit::check_redundancy(&sa);
//! });
//! ```

pub mod array;
pub mod cluster;
pub mod geometries;
pub mod records;
pub mod redundancy;
pub mod workload;

pub use array::{
    clean_spec, config, create_clean, devs, reassemble, reassemble_with, settle, sim_array,
    sim_array_with, SimArray,
};
pub use geometries::all_geometries;
pub use redundancy::{check_redundancy, redundancy_error, redundancy_error_in};
pub use workload::{run_workload, DiskModel};
