//! The unit tests of `in_store.rs` (its behaviour on a store: charge-once's
//! `tests/in_store.rs`, on moto).

use super::*;
use crate::breaker::Breakers;
use crate::deadline::Budget;

#[test]
fn a_key_is_the_prefix_and_the_id_and_an_id_that_cannot_be_one_is_refused() {
    assert_eq!(key_of("puntos", "buy-1").unwrap(), "puntos#buy-1");
    assert!(key_of("puntos", "").is_err());
    assert!(key_of("puntos", "a#b").unwrap_err().0.contains("'#'"));
}

#[test]
fn two_lists_of_fields_never_share_a_fingerprint_by_where_they_split() {
    let ab_c = fingerprint_of(&["ab".to_owned(), "c".to_owned()]);
    let a_bc = fingerprint_of(&["a".to_owned(), "bc".to_owned()]);
    assert_ne!(ab_c, a_bc);
    assert_eq!(ab_c, fingerprint_of(&["ab".to_owned(), "c".to_owned()]));
    assert_eq!(ab_c.len(), 64);
}

/// An effect that asks for one write more than a transaction holds.
struct Greedy;

impl InStoreEffect for Greedy {
    type Fact = String;
    const PREFIX: &'static str = "greedy";
    fn parse(&self, body: &str) -> Result<String, Invalid> {
        Ok(body.to_owned())
    }
    fn id<'f>(&self, fact: &'f String) -> &'f str {
        fact
    }
    fn fields(&self, _fact: &String) -> Vec<String> {
        Vec::new()
    }
    fn writes(&self, _fact: &String) -> Vec<TransactWriteItem> {
        vec![TransactWriteItem::builder().build(); MOST_WRITES + 1]
    }
}

#[tokio::test]
async fn a_fact_that_asks_too_many_writes_fails_alone_and_never_counts_against_the_store() {
    // A client that would reach nothing: the store is never called.
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
        .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
        .endpoint_url("http://127.0.0.1:9")
        .build();
    let ledger = DynamoLedger::new(Client::from_conf(config), "t");
    let safeguards = Safeguards {
        clock: crate::clock::system(),
        budget: Budget::new(Duration::from_secs(3), Duration::from_secs(1)),
        breakers: Arc::new(Breakers::new(
            1,
            Duration::from_secs(30),
            Duration::from_secs(60),
        )),
    };
    let consumer = Consumer::new(ledger, Greedy, safeguards.clone(), Duration::from_secs(60));
    let deadline = safeguards.now() + Duration::from_secs(60);
    for _ in 0..3 {
        let refused = consumer.apply(&"f-1".to_owned(), deadline).await;
        assert!(
            matches!(refused, Err(ApplyError::TooManyWrites(100))),
            "{refused:?}"
        );
    }
    assert!(
        safeguards.breakers.store.is_closed(),
        "the store was never asked"
    );
}
