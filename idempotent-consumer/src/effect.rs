//! An effect a provider applies under an idempotency key (a transfer, a message sent,
//! an object created at another service), as a trait, and [`apply`]: the loop that
//! performs the record machine's steps for it, every call through the one executor.
//! The application writes the effect (perform under the key, look up what an unknown
//! outcome did, cancel an attempt left open) and says how its failures read
//! ([`Classify`], [`ProviderFailure`]); the record, its fenced writes, the provider key
//! of each attempt, the lookups before a new key, the breakers, the pace and the
//! deadline come with it. [`Consumer`] is the Lambda function around it: the SQS batch,
//! each record's verdict from its end, dead letters with their notes.

use std::marker::PhantomData;
use std::time::Duration;

use async_trait::async_trait;
use tracing::{Span, debug, info_span, warn};

use crate::clock::Time;
use crate::consumer::{self, Verdict, Verdicts};
use crate::executor::{Closed, Executor, NoAnswer, Observe, ProviderFailure, Safeguards, Wait};
use crate::in_store::Invalid;
use crate::jitter::Jitter;
use crate::machine::{
    Cancel, Classify, End, Found, Input, Machine, Receipt, Retry, Shared, Start, Step, Unknown,
    WriteKind,
};
use crate::queue::Queue;
use crate::record::{Identity, Owner};
use crate::rules::Rules;
use crate::store::{IdempotencyStore, StoreError, WriteOutcome};
use crate::{envelope, error_chain};
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use std::sync::Arc;

/// An effect a provider applies once per fact, under the idempotency key the machine
/// names for each attempt (`<pk>#<attempt>`).
#[async_trait]
pub trait Effect: Send + Sync {
    /// What one message says happened.
    type Fact: Send + Sync;
    /// Why a provider call gave no answer the machine can use.
    type Failure: Classify + ProviderFailure + std::error::Error + Send + Sync + 'static;
    /// What an unknown outcome means: [`Unknown::LookedUp`] when the provider keeps
    /// each key and [`Effect::look_up`] can find what it did.
    const UNKNOWN: Unknown = Unknown::LookedUp;

    /// Reads a fact from a message body (the envelope already taken off).
    fn parse(&self, body: &str) -> Result<Self::Fact, Invalid>;

    /// The fact's key (`Key::new("<kind>#", id)`: the business fact, never the
    /// transport's message id) and the fingerprint of its fields.
    fn identity(&self, fact: &Self::Fact) -> Identity;

    /// Applies the effect under `key`; the same key again answers as the first time.
    async fn perform(&self, fact: &Self::Fact, key: &str) -> Result<Receipt, Self::Failure>;

    /// What the provider did for `fact` since `since` (the record's creation, less a
    /// margin for clocks): done, in flight, open, or nothing.
    async fn look_up(&self, fact: &Self::Fact, since: Time) -> Result<Found, Self::Failure>;

    /// Cancels an attempt left open, so that nobody can confirm it once a new key is
    /// used. An effect that leaves nothing open answers `NotCancellable`.
    async fn cancel(&self, reference: &str) -> Result<Cancel, Self::Failure>;

    /// Whether a failed [`Effect::perform`] is sent once more within the invocation,
    /// under the same key (a replay, so it cannot apply twice), after a pause of
    /// [`Effect::REPLAY_PAUSE`] while the provider's breaker is closed and the deadline
    /// allows it: a dropped connection or a server error the provider did not advise
    /// against retrying. None by default; a timeout should not be (a hanging provider
    /// would cost its timeout twice).
    fn replay_now(&self, _failure: &Self::Failure) -> bool {
        false
    }

    /// The bounds of the jittered pause before that replay, so that the records of a
    /// batch do not replay together.
    const REPLAY_PAUSE: (Duration, Duration) =
        (Duration::from_millis(100), Duration::from_millis(400));
}

/// What an application sees of the record machine's steps besides the executor's
/// calls: a span per store write, and each answer before the machine reads it (for
/// its metrics, warnings and crash points; what the answer means is the machine's).
/// Every method has a default.
pub trait Witness: Observe {
    /// The counter of performs sent again within the invocation ([`Effect::replay_now`]).
    const REPLAYED: &'static str = "perform_replayed";

    /// The span of one store write.
    fn write_span(&self, kind: WriteKind) -> Span {
        info_span!("store write", write = ?kind)
    }

    /// What a write answered, on its span; `started_at` is when the record's work
    /// started (a reservation of an older record is a takeover).
    fn written(
        &self,
        _span: &Span,
        _kind: WriteKind,
        _answer: &Result<WriteOutcome, NoAnswer<StoreError>>,
        _started_at: Time,
    ) {
    }

    /// What a perform answered under the machine's `attempt`.
    fn performed(&self, _answer: &Result<Receipt, NoAnswer<Self::Failure>>, _attempt: u32) {}
}

/// The provider calls of an [`Effect`], as traces name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EffectCall {
    /// [`Effect::perform`].
    Perform,
    /// [`Effect::look_up`].
    LookUp,
    /// [`Effect::cancel`].
    Cancel,
}

/// The [`Observe`] of an [`Effect`]'s calls: a span per request and per wait, named by
/// [`EffectCall`].
pub struct Traced<F>(PhantomData<fn() -> F>);

impl<F: ProviderFailure + std::error::Error + 'static> Witness for Traced<F> {}

impl<F> Default for Traced<F> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<F: ProviderFailure + std::error::Error + 'static> Observe for Traced<F> {
    type Call = EffectCall;
    type Failure = F;

    fn call_span(&self, call: EffectCall, retry: bool) -> Span {
        info_span!("provider call", call = ?call, retry)
    }

    fn answered(&self, span: &Span, failure: Option<&NoAnswer<F>>) {
        if let Some(failure) = failure {
            let why = match failure {
                NoAnswer::NoTime => "no time left".to_owned(),
                NoAnswer::TimedOut => "timed out".to_owned(),
                NoAnswer::Failed(e) => crate::error_chain(e),
            };
            debug!(parent: span, failure = %why, "no answer");
        }
    }

    fn wait_span(&self, wait: Wait, planned: Duration) -> Span {
        let planned_ms = u64::try_from(planned.as_millis()).unwrap_or(u64::MAX);
        info_span!("wait", wait = ?wait, planned_ms)
    }
}

/// How long records are kept and how long the machine waits, for every fact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// `expires` = now + this: retention only, never correctness.
    pub retention: Duration,
    /// Keys first sent longer ago than this are looked up before reuse: less than the
    /// provider keeps its keys.
    pub key_ttl: Duration,
    /// Counted refusals of a fact before deliveries stop calling the provider.
    pub max_refusals: u32,
    /// How long a fact awaits someone's confirmation.
    pub someone_wait: Duration,
    /// How long a fact awaits an effect the provider processes.
    pub processing_wait: Duration,
}

impl Policy {
    /// 90 days of retention, keys looked up after 23 hours (a provider that keeps them
    /// 24), 3 refusals, a week for a person, two weeks for processing.
    pub fn standard() -> Self {
        Self {
            retention: Duration::from_secs(90 * 24 * 3600),
            key_ttl: Duration::from_secs(23 * 3600),
            max_refusals: 3,
            someone_wait: Duration::from_secs(7 * 24 * 3600),
            processing_wait: Duration::from_secs(14 * 24 * 3600),
        }
    }
}

/// Applies `fact` once in effect: the record machine's steps, each store write and
/// provider call through `executor` (its breakers admitting the work, its budget and
/// pace bounding each call). `Err`: a breaker is open, and nothing was written or
/// asked.
pub async fn apply<E, O>(
    effect: &E,
    store: &dyn IdempotencyStore,
    executor: &Executor<'_, O>,
    policy: &Policy,
    fact: &E::Fact,
    identity: &Identity,
) -> Result<End<Shared<E::Failure>>, Closed>
where
    E: Effect,
    O: Witness<Failure = E::Failure>,
    O::Call: From<EffectCall>,
{
    executor
        .admitted(run(effect, store, executor, policy, fact, identity))
        .await
}

async fn run<E, O>(
    effect: &E,
    store: &dyn IdempotencyStore,
    executor: &Executor<'_, O>,
    policy: &Policy,
    fact: &E::Fact,
    identity: &Identity,
) -> End<Shared<E::Failure>>
where
    E: Effect,
    O: Witness<Failure = E::Failure>,
    O::Call: From<EffectCall>,
{
    let observe = executor.observe();
    let now = executor.now();
    let (mut machine, mut step) = Machine::new(Start {
        identity: identity.clone(),
        owner: Owner::fresh(),
        now,
        deadline: executor.deadline(),
        expires: Time::from_secs((now + policy.retention).as_secs()),
        max_refusals: policy.max_refusals,
        key_ttl: policy.key_ttl,
        someone_wait: policy.someone_wait,
        processing_wait: policy.processing_wait,
        unknown: E::UNKNOWN,
        rules: Rules::ALL,
    });
    // Bounded: each step is a call under the deadline, and the machine ends within a
    // few of them (its lookups and cancels are counted).
    loop {
        step = match step {
            Step::Done(end) => return end,
            Step::Write(kind) => {
                let span = observe.write_span(kind);
                let answer = {
                    let write = machine.write(kind, executor.now());
                    executor.store(&span, store.write(&write)).await
                };
                observe.written(&span, kind, &answer, now);
                let next = machine.on(Input::Written(answer));
                if next == Step::Write(WriteKind::CompleteAttempt) {
                    warn!(
                        attempt = machine.attempt(),
                        "lease lost before complete; completing by attempt"
                    );
                }
                next
            }
            Step::Perform { key } => {
                let answer = perform(effect, executor, fact, &key).await;
                observe.performed(&answer, machine.attempt());
                machine.on(Input::Performed(answer.map_err(shared)))
            }
            Step::Lookup => {
                let since = machine.lookup_since();
                let answer = executor
                    .provider(EffectCall::LookUp.into(), false, || {
                        effect.look_up(fact, since)
                    })
                    .await;
                machine.on(Input::Looked(answer.map_err(shared)))
            }
            Step::Cancel { reference } => {
                let answer = executor
                    .provider(EffectCall::Cancel.into(), false, || {
                        effect.cancel(&reference)
                    })
                    .await;
                machine.on(Input::Cancelled(answer.map_err(shared)))
            }
        };
    }
}

/// The perform under `key`, and its one replay within the invocation when the effect
/// asks for it ([`Effect::replay_now`]) and the executor allows it. A rate limit or a
/// lock was already waited for, at the pace.
async fn perform<E, O>(
    effect: &E,
    executor: &Executor<'_, O>,
    fact: &E::Fact,
    key: &str,
) -> Result<Receipt, NoAnswer<E::Failure>>
where
    E: Effect,
    O: Witness<Failure = E::Failure>,
    O::Call: From<EffectCall>,
{
    let answer = executor
        .provider(EffectCall::Perform.into(), false, || {
            effect.perform(fact, key)
        })
        .await;
    let replay = matches!(&answer, Err(NoAnswer::Failed(failure)) if effect.replay_now(failure));
    if !replay {
        return answer;
    }
    let pause = Jitter::random().between(E::REPLAY_PAUSE.0, E::REPLAY_PAUSE.1);
    if !executor.pause_before_retry(pause).await {
        return answer;
    }
    metrics::counter!(O::REPLAYED).increment(1);
    executor
        .provider(EffectCall::Perform.into(), true, || {
            effect.perform(fact, key)
        })
        .await
}

/// A call's missing answer, its failure shared as the machine keeps it.
fn shared<F>(no_answer: NoAnswer<F>) -> NoAnswer<Shared<F>> {
    no_answer.map_failure(Shared::new)
}

/// A Lambda consumer of an effect at a provider: built once at cold start, shared by
/// every invocation. Each record is applied with [`apply`]; its end decides its
/// verdict: done, a duplicate or handed to someone (awaiting) is acknowledged; a
/// conflict, a fact at its refusal limit, a refusal for good or a record that needs a
/// person goes to the dead-letter queue with its note; anything else comes back.
pub struct Consumer<E: Effect> {
    store: Arc<dyn IdempotencyStore>,
    effect: E,
    safeguards: Safeguards,
    policy: Policy,
    observe: Traced<E::Failure>,
    dead_letters: Option<Arc<dyn Queue>>,
}

impl<E: Effect> Consumer<E> {
    /// A consumer of `effect` on `store` (a [`crate::dynamodb::DynamoStore`] in
    /// Lambda), under `safeguards` and `policy`; no dead-letter queue until
    /// [`Self::with_dead_letters`].
    pub fn new(
        store: Arc<dyn IdempotencyStore>,
        effect: E,
        safeguards: Safeguards,
        policy: Policy,
    ) -> Self {
        Self {
            store,
            effect,
            safeguards,
            policy,
            observe: Traced::default(),
            dead_letters: None,
        }
    }

    /// The consumer that sends a record no retry can fix to the dead-letter queue at
    /// once, with a note saying why, and acknowledges it once the send succeeded.
    pub fn with_dead_letters(self, queue: Arc<dyn Queue>) -> Self {
        Self {
            dead_letters: Some(queue),
            ..self
        }
    }

    /// Runs a batch whose invocation ends at `deadline`.
    pub async fn run(&self, event: &SqsEvent, deadline: Time) -> SqsBatchResponse {
        consumer::run(self, event, deadline).await
    }

    /// Serves Lambda's invocations until the runtime stops: the consumer's whole life
    /// in a Lambda function.
    pub async fn serve(self) -> Result<(), lambda_runtime::Error>
    where
        E: 'static,
    {
        consumer::serve_batches(Arc::new(self)).await
    }

    /// How one record ends, before the queue is told.
    async fn verdict(&self, message: &SqsMessage, deadline: Time) -> Verdict {
        let fact = match envelope::body(message.body.as_deref().unwrap_or_default())
            .and_then(|body| self.effect.parse(&body))
        {
            Ok(fact) => fact,
            Err(invalid) => return Verdict::dead("invalid", invalid.0),
        };
        let identity = self.effect.identity(&fact);
        let executor = Executor::new(self.safeguards.clone(), &self.observe, deadline);
        let store = self.store.as_ref();
        match apply(
            &self.effect,
            store,
            &executor,
            &self.policy,
            &fact,
            &identity,
        )
        .await
        {
            Ok(end) => verdict_of(end),
            Err(closed) => Verdict::Retry(format!(
                "the {:?} breaker is open: nothing written or asked",
                closed.dependency
            )),
        }
    }
}

impl<E: Effect> Verdicts for Consumer<E> {
    fn safeguards(&self) -> &Safeguards {
        &self.safeguards
    }

    fn dead_letters(&self) -> Option<&Arc<dyn Queue>> {
        self.dead_letters.as_ref()
    }

    fn verdict<'a>(
        &'a self,
        message: &'a SqsMessage,
        deadline: Time,
    ) -> consumer::VerdictFuture<'a> {
        Box::pin(Consumer::verdict(self, message, deadline))
    }
}

/// What becomes of a record, by how the machine ended it.
fn verdict_of<F: std::error::Error + 'static>(end: End<Shared<F>>) -> Verdict {
    match end {
        End::Done { found: false, .. } => Verdict::Acked("done"),
        End::Done { found: true, .. } => Verdict::Acked("found"),
        End::Duplicate { .. } => Verdict::Acked("duplicate"),
        End::Awaiting { .. } | End::AlreadyAwaiting { .. } => Verdict::Acked("awaiting"),
        End::Settled { .. } => Verdict::Acked("settled"),
        End::Ignored { .. } => Verdict::Acked("ignored"),
        End::Unrecorded { .. } => Verdict::Acked("unrecorded"),
        End::Conflict => Verdict::dead(
            "conflict",
            "its id is another fact's, with other fields; never applied".to_owned(),
        ),
        End::RefusalLimit { refusals } => Verdict::dead(
            "refusal_limit",
            format!("refused {refusals} times: not sent again until a person resets it"),
        ),
        End::RefusedForGood { failure, .. } => Verdict::dead("refused", error_chain(&failure)),
        End::Unresolved { cause } => Verdict::dead("needs_a_person", format!("{cause:?}")),
        End::Refused { attempt, .. } => Verdict::Retry(format!(
            "refused under attempt {attempt}; the next delivery tries the next key"
        )),
        End::InProgress { .. } => Verdict::Retry("another delivery holds its lease".to_owned()),
        End::Retry { cause, .. } => Verdict::Retry(match &cause {
            // The effect's own words, with their sources.
            Retry::Effect(failure) | Retry::Lookup(failure) | Retry::Cancel(failure) => {
                error_chain(failure)
            }
            other => format!("{other:?}"),
        }),
        End::Deadline { before, .. } => Verdict::Retry(format!(
            "not started before its {before:?}: too little time left"
        )),
    }
}
