//! The unit tests of `executor.rs`.

use super::*;

/// A provider's failure as the executor reads it.
#[derive(Debug)]
enum Failure {
    Down,
    RateLimited,
    Refused,
}

impl ProviderFailure for Failure {
    fn is_down(&self) -> bool {
        matches!(self, Self::Down)
    }
    fn throttle(&self) -> Option<Throttle> {
        matches!(self, Self::RateLimited).then_some(Throttle::RateLimited)
    }
    fn advised_not_to_retry(&self) -> bool {
        false
    }
    fn refuses_the_key(&self) -> bool {
        false
    }
    fn not_sent() -> Self {
        Self::RateLimited
    }
}

#[test]
fn only_a_provider_that_is_down_counts_toward_its_breaker() {
    let breaker = Breaker::new(1, Duration::from_secs(1), Duration::from_secs(2));
    let now = Time::from_ms(0);
    for failure in [Failure::RateLimited, Failure::Refused] {
        for _ in 0..10 {
            let answer: Result<(), _> = Err(NoAnswer::Failed(failure_copy(&failure)));
            tell_breaker(&breaker, &answer, now, Failure::is_down);
        }
    }
    assert!(
        breaker.is_closed(),
        "backpressure and refusals kept it closed"
    );
    let not_started: Result<(), NoAnswer<Failure>> = Err(NoAnswer::NoTime);
    assert!(!tell_breaker(&breaker, &not_started, now, Failure::is_down));
    assert!(breaker.is_closed(), "a call not started says nothing");
    let down: Result<(), _> = Err(NoAnswer::Failed(Failure::Down));
    tell_breaker(&breaker, &down, now, Failure::is_down);
    assert!(
        !breaker.is_closed(),
        "one failure in a row is its threshold"
    );
}

fn failure_copy(failure: &Failure) -> Failure {
    match failure {
        Failure::Down => Failure::Down,
        Failure::RateLimited => Failure::RateLimited,
        Failure::Refused => Failure::Refused,
    }
}
