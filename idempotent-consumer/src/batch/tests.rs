//! The batch's plan for any fact: parsing with the fact's parser, grouping by key,
//! chaining by what the provider locks, a group of its own for a record that names no
//! fact, and the trace id. charge-once's `policy/batch/plan/tests.rs` runs the same
//! plan with its own facts and events, rule by rule.

use super::*;

/// A test fact: `<key>` or `<key>@<lock>`, or `?<object>` for one that names no fact.
#[derive(Debug)]
struct Fact {
    key: Option<Key>,
    object: String,
    lock: Option<String>,
}

impl Unit for Fact {
    fn key(&self) -> Option<&Key> {
        self.key.as_ref()
    }

    fn group_key(&self) -> Option<&str> {
        self.key().map(Key::as_str).or(Some(self.object.as_str()))
    }

    fn chain_key(&self) -> Option<&str> {
        self.lock.as_deref()
    }
}

#[derive(Debug)]
struct Done;

impl Ending for Done {
    fn handling(&self) -> Handling {
        Handling::Ack
    }
    fn until(&self) -> Option<Time> {
        None
    }
    fn reason(&self) -> Option<Cow<'static, str>> {
        None
    }
}

#[derive(Debug, thiserror::Error)]
#[error("not a fact: {0}")]
struct NotAFact(String);

fn parse_fact(body: &str) -> Result<Fact, NotAFact> {
    if let Some(object) = body.strip_prefix('?') {
        return Ok(Fact {
            key: None,
            object: object.to_owned(),
            lock: None,
        });
    }
    let (id, lock) = match body.split_once('@') {
        Some((id, lock)) => (id, Some(lock.to_owned())),
        None => (body, None),
    };
    if id.is_empty() || id.contains('#') {
        return Err(NotAFact(body.to_owned()));
    }
    Ok(Fact {
        key: Some(Key::new("fact#", id)),
        object: String::new(),
        lock,
    })
}

fn messages(bodies: &[&'static str]) -> Vec<Message<'static>> {
    bodies
        .iter()
        .enumerate()
        .map(|(i, body)| Message {
            message_id: Some(["m0", "m1", "m2", "m3", "m4", "m5"][i]),
            body: Some(body),
            ..Message::default()
        })
        .collect()
}

#[test]
fn copies_of_a_fact_are_grouped_and_facts_sharing_a_lock_are_chained() {
    let msgs = messages(&["a@l1", "b@l1", "a@l1", "c@l2", "?obj", "#bad"]);
    let mut entries: Vec<Entry<'_, Fact, Done, NotAFact>> = parse(&msgs, parse_fact).unwrap();
    assert!(matches!(entries[5].outcome, RecordOutcome::Invalid));
    assert_eq!(
        entries[5].reason().as_deref(),
        Some("not a fact: #bad"),
        "an invalid record says why"
    );
    let schedule = schedule(&mut entries, FifoScope::Group);
    assert_eq!(schedule.groups, vec![vec![0, 2], vec![1], vec![3], vec![4]]);
    // `a` and `b` share the lock `l1`; `c` has its own; the record that names no fact
    // runs on a chain of its own, never dropped.
    assert_eq!(schedule.chains, vec![vec![0, 1], vec![2], vec![3]]);
    assert_eq!(schedule.skip, Skip::SameFact);
}

#[test]
fn a_record_without_a_message_id_fails_the_whole_batch() {
    let mut msgs = messages(&["a"]);
    msgs[0].message_id = None;
    let parsed: Result<Vec<Entry<'_, Fact, Done, NotAFact>>, _> = parse(&msgs, parse_fact);
    assert!(matches!(
        parsed,
        Err(BatchError::MissingMessageId { index: 0 })
    ));
}

#[test]
fn the_trace_id_is_the_root_of_the_x_ray_header() {
    let header = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
    assert_eq!(
        trace_root(header),
        Some("1-5759e988-bd862e3fe1be46a994272793")
    );
    assert_eq!(trace_root("Parent=1;Root=1-a-b"), Some("1-a-b"));
    assert_eq!(trace_root("Parent=1;Sampled=0"), None);
    assert_eq!(trace_root("Root="), None);
}

#[test]
fn groups_keep_first_appearance_and_message_order() {
    let keyed = vec![(0, "b"), (1, "a"), (2, "b"), (3, "c"), (4, "a")];
    assert_eq!(group_in_order(keyed), vec![vec![0, 2], vec![1, 4], vec![3]]);
}
