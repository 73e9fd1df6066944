//! The safety rules of the state machine (ARCHITECTURE.md, "The rules and their
//! mutants"). Each can be switched off, for the model checker's mutants only:
//! production always runs [`Rules::ALL`]. The rules a driver keeps rather than the
//! machine (the provider gets the key the machine names; a dead letter is acknowledged
//! only after its send) have their mutants in the model's own driver
//! (`examples/model.rs`), so the machine carries nothing that only a mutant reads.

/// The safety rules of ARCHITECTURE.md, "The table" and "The state machine". Each exists because switching it off lets the
/// model checker find a double charge or a lost message (`make model MUTANT=…`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rules {
    /// `complete` and `release` are fenced on the owner token.
    pub fenced: bool,
    /// An uncertain charge failure (timeout, 5xx, …) keeps the provider key.
    pub keep_key_when_uncertain: bool,
    /// `Done` is final, whatever `expires` says.
    pub done_is_final: bool,
    /// A `pending` charge found by reconciliation is live: no new key.
    pub pending_is_live: bool,
    /// A key older than the provider-key TTL is reconciled before it is reused.
    pub reconcile_old_keys: bool,
    /// A replayed 5xx keeps the key, as a timeout does: its payment may still appear
    /// (Stripe rolls some forward after an incident), so only the forgotten-key rule
    /// may move the order to a new key.
    pub keep_key_after_server_error: bool,
    /// At most one payment per order can succeed, whoever confirms it: an open payment
    /// (declined, or waiting for the customer's authentication) is cancelled before a
    /// new key is used, and one waiting for the customer keeps its key.
    pub close_open_payments: bool,
    /// An order that awaits its customer is held by the payment it names: no delivery
    /// reserves it (nor counts it as absent), so no other payment is made while that
    /// one may still succeed.
    pub awaiting_holds_the_order: bool,
    /// Settling an awaiting record requires the payment it names: an event or a lookup
    /// of any other payment changes nothing.
    pub settle_names_its_payment: bool,
    /// A wait ends only once its payment can no longer succeed: cancelled (the expiry
    /// cancels it first; a refused cancel means look again), never on a failed
    /// attempt, which the customer may still follow with a confirmation.
    pub wait_ends_only_when_cancelled: bool,
    /// An event only names a payment: the provider's answer, fetched by id, decides,
    /// never what the event's body says (anyone allowed to send to the queue can
    /// write one).
    pub event_is_a_hint: bool,
    /// The provider never deletes a payment: one it does not know (404) is a wrong
    /// setting, and ends nothing.
    pub missing_is_a_fault: bool,
    /// A payment the provider says succeeded, which the record does not await, is
    /// recorded (when provably the order's) or dead-lettered, never acknowledged as
    /// nothing.
    pub money_taken_is_recorded: bool,
    /// A corrected copy (another payload) takes the record only once the order ended
    /// without any payment that can still succeed: every earlier key's payment
    /// cancelled and the current key never sent.
    pub correct_only_when_closed: bool,
}

impl Rules {
    /// Every rule on: the only value production uses.
    pub const ALL: Self = Self {
        fenced: true,
        keep_key_when_uncertain: true,
        done_is_final: true,
        pending_is_live: true,
        reconcile_old_keys: true,
        keep_key_after_server_error: true,
        close_open_payments: true,
        awaiting_holds_the_order: true,
        settle_names_its_payment: true,
        wait_ends_only_when_cancelled: true,
        event_is_a_hint: true,
        missing_is_a_fault: true,
        money_taken_is_recorded: true,
        correct_only_when_closed: true,
    };
}

impl Default for Rules {
    fn default() -> Self {
        Self::ALL
    }
}
