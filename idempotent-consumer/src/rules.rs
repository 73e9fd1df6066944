//! The safety rules of the machines and the table. Each can be switched off, for a
//! model checker's mutants only: production always runs [`Rules::ALL`]. Each exists
//! because switching it off lets the model checker find an effect applied twice or a
//! message lost (charge-once's `make model MUTANT=…` shows each).

/// The safety rules, one flag each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rules {
    /// `complete` and `release` are fenced on the owner token.
    pub fenced: bool,
    /// An uncertain failure of the effect (timeout, 5xx, …) keeps the provider key.
    pub keep_key_when_uncertain: bool,
    /// `Done` is final, whatever `expires` says.
    pub done_is_final: bool,
    /// An effect in flight found by a lookup is live: no new key.
    pub pending_is_live: bool,
    /// A key older than the provider's key retention is looked up before it is reused.
    pub reconcile_old_keys: bool,
    /// A replayed 5xx keeps the key, as a timeout does: its effect may still appear
    /// (a provider may roll some forward after an incident), so only the
    /// forgotten-key rule may move the fact to a new key.
    pub keep_key_after_server_error: bool,
    /// At most one attempt per fact can succeed, whoever confirms it: an open attempt
    /// (refused, or waiting for someone to confirm it) is cancelled before a new key
    /// is used, and one waiting for someone keeps its key.
    pub close_open_attempts: bool,
    /// A fact that awaits someone is held by the reference it names: no delivery
    /// reserves it (nor counts it as absent), so no other attempt is made while that
    /// one may still succeed.
    pub awaiting_holds_the_fact: bool,
    /// Settling an awaiting record requires the reference it names: an event or a
    /// lookup of anything else changes nothing.
    pub settle_names_what_it_awaits: bool,
    /// A wait ends only once its effect can no longer happen: cancelled (the expiry
    /// cancels it first; a refused cancel means look again), never on a failed
    /// attempt, which someone may still follow with a confirmation.
    pub wait_ends_only_when_cancelled: bool,
    /// An event only names an object: the provider's answer, fetched by id, decides,
    /// never what the event's body says (anyone allowed to send to the queue can
    /// write one).
    pub event_is_a_hint: bool,
    /// The provider never deletes what it did: an object it does not know (404) is a
    /// wrong setting, and ends nothing.
    pub missing_is_a_fault: bool,
    /// An effect the provider says happened, which the record does not await, is
    /// recorded (when provably the fact's) or dead-lettered, never acknowledged as
    /// nothing.
    pub effect_found_is_recorded: bool,
    /// A corrected copy (another payload) takes the record only once the fact ended
    /// without any effect that can still happen: every earlier key's attempt
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
        close_open_attempts: true,
        awaiting_holds_the_fact: true,
        settle_names_what_it_awaits: true,
        wait_ends_only_when_cancelled: true,
        event_is_a_hint: true,
        missing_is_a_fault: true,
        effect_found_is_recorded: true,
        correct_only_when_closed: true,
    };
}

impl Default for Rules {
    fn default() -> Self {
        Self::ALL
    }
}
