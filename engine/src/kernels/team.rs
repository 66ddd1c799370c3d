//! Keeping the compute team awake for the length of a forward pass.
//!
//! A pass is a few hundred short parallel regions (matmuls, quantizing, attention)
//! with serial steps between them. Between regions rayon's idle workers spin a
//! little, then sleep on a futex; on a VM every such sleep halts a vCPU, and the next
//! region waits for it to be woken. [`awake`] runs a pass with every other worker of
//! the pool held in a loop that takes the pass's work as soon as it is posted
//! (`rayon::yield_now`) and yields the CPU between looks, until the pass ends: one
//! wake-up per pass instead of one per sleep, as llama.cpp's threadpool spins
//! through a graph. `SWITCHYARD_NO_SPIN=1` turns it off (to measure the difference).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// Whether passes keep the team awake (unless `SWITCHYARD_NO_SPIN` is set).
fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SWITCHYARD_NO_SPIN").is_none())
}

/// Runs `f` (a forward pass) with the current rayon pool's other workers awake.
/// Outside a pool, or in a pool of one, it just runs `f`.
pub fn awake<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let threads = rayon::current_num_threads();
    let Some(owner) = rayon::current_thread_index() else {
        return f();
    };
    if threads < 2 || !enabled() {
        return f();
    }
    let done = AtomicBool::new(false);
    rayon::scope(|s| {
        for _ in 1..threads {
            s.spawn(|_| {
                // The pass's own thread may pick this up while it waits for a
                // stolen half: it must not spin on its own pass.
                if rayon::current_thread_index() == Some(owner) {
                    return;
                }
                while !done.load(Ordering::Acquire) {
                    if rayon::yield_now() != Some(rayon::Yield::Executed) {
                        std::thread::yield_now();
                    }
                }
            });
        }
        // Set however `f` ends: the scope waits for the spinners before it passes a
        // panic on, so a pass that panics must still let them go.
        let _done = Done(&done);
        f()
    })
}

/// Sets its flag when dropped.
struct Done<'a>(&'a AtomicBool);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::awake;
    use rayon::prelude::*;

    fn sum_of_squares() -> u64 {
        (0..10_000u64).into_par_iter().map(|i| i * i).sum()
    }

    #[test]
    fn a_pass_gets_its_answer_in_pools_of_every_size_and_outside_one() {
        let want: u64 = (0..10_000u64).map(|i| i * i).sum();
        assert_eq!(awake(sum_of_squares), want);
        for threads in [1, 2, 3, 4] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            for _ in 0..50 {
                assert_eq!(pool.install(|| awake(sum_of_squares)), want, "{threads} threads");
            }
            // Passes back to back, and the pool still runs plain work after them.
            assert_eq!(pool.install(sum_of_squares), want);
        }
    }

    #[test]
    fn a_pass_that_panics_passes_the_panic_on_instead_of_hanging() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.install(|| {
                awake(|| {
                    sum_of_squares();
                    panic!("a pass fails")
                })
            })
        }));
        assert!(got.is_err());
        // The pool still works afterwards.
        assert_eq!(
            pool.install(|| awake(sum_of_squares)),
            (0..10_000u64).map(|i| i * i).sum::<u64>()
        );
    }

    #[test]
    fn nested_passes_finish() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let got = pool.install(|| awake(|| awake(sum_of_squares) + awake(sum_of_squares)));
        assert_eq!(got, 2 * (0..10_000u64).map(|i| i * i).sum::<u64>());
    }
}
