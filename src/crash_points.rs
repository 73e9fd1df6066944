//! Named crash points for the pinned-crash test (`tests/crash_points.rs`). Compiled
//! only with the `crash-points` feature, which no shipped build enables: there the
//! hook is an empty inline function.
//!
//! With the feature, when `CHARGE_ONCE_CRASH_AT` names the point reached, the process
//! prints `crash-point <name>` on stderr and waits to be SIGKILLed by the test, so it
//! dies exactly there: after the reserve, after the charge request reached the
//! provider, after the charge answered, after `complete`.

/// Stops the process at `name` when the test asked for it (feature builds only).
#[cfg(feature = "crash-points")]
pub fn reached(name: &'static str) {
    if std::env::var("CHARGE_ONCE_CRASH_AT").as_deref() == Ok(name) {
        eprintln!("crash-point {name}");
        // The test kills the process on that line; bounded in case it does not.
        std::thread::sleep(std::time::Duration::from_secs(30));
        std::process::abort();
    }
}

/// Stops the process at `name` when the test asked for it (feature builds only).
#[cfg(not(feature = "crash-points"))]
#[inline(always)]
pub fn reached(_name: &'static str) {}
