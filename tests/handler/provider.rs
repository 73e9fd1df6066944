//! The provider's answers: panics, store errors, leases, old keys, replayed server
//! errors, pending and processing payments, declines bounded, slow calls, the breaker,
//! `resolve` beside the consumer.

use super::*;

#[tokio::test]
async fn a_panicking_provider_call_fails_only_its_record() {
    let h = harness().await;
    h.provider.script("ord-9002", &[Fault::Panic]);
    let failed = h.invoke("tests/three-orders.json").await;
    assert_eq!(failed, message_ids("tests/three-orders.json", &[1]));
    assert_eq!(h.provider.charges_for("ord-9001").len(), 1);
    assert_eq!(h.provider.charges_for("ord-9003").len(), 1);
    // The panicking record's lease ends at the invocation deadline; then it is retried.
    h.redeliver_later();
    assert_eq!(
        h.invoke("tests/three-orders.json").await,
        Vec::<String>::new()
    );
    assert_eq!(h.provider.charges_for("ord-9002").len(), 1);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_store_error_on_complete_fails_the_record_and_the_retry_completes_it_with_the_same_receipt()
 {
    let h = harness().await;
    h.store.fail_completes.store(1, Ordering::SeqCst);
    assert_eq!(
        h.invoke("sqs-single.json").await,
        message_ids("sqs-single.json", &[0])
    );
    let charges = h.provider.charges_for("ord-1001");
    assert_eq!(charges.len(), 1, "charged, but the receipt was not stored");
    assert_eq!(h.record("ord-1001").await.unwrap().state, State::InProgress);

    h.redeliver_later();
    assert_eq!(h.invoke("sqs-single.json").await, Vec::<String>::new());
    assert_eq!(
        h.provider.keys_for("ord-1001"),
        ["cobro#ord-1001#1", "cobro#ord-1001#1"]
    );
    assert_eq!(h.provider.charges_for("ord-1001"), charges);
    let record = h.record("ord-1001").await.unwrap();
    assert_eq!(record.state, State::Done);
    assert_eq!(record.receipt, Some(charges[0].clone()));
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_retry_while_the_lease_is_live_fails_as_in_progress_without_a_call() {
    let h = harness().await;
    h.store.fail_completes.store(1, Ordering::SeqCst);
    h.invoke("sqs-single.json").await;
    // Redelivered before the first invocation's deadline: the lease still holds.
    assert_eq!(
        h.invoke("sqs-single.json").await,
        message_ids("sqs-single.json", &[0])
    );
    assert_eq!(h.provider.calls_for("ord-1001").len(), 1);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_key_older_than_the_provider_ttl_is_reconciled_and_found() {
    let h = harness().await;
    h.provider.script("ord-1001", &[Fault::ChargeThenTimeout]);
    h.invoke("sqs-single.json").await;
    assert_eq!(h.provider.charges_for("ord-1001").len(), 1);
    // A day later the provider has forgotten the key; re-sending it would charge again.
    h.clock.advance(Duration::from_secs(24 * 3600));
    h.provider.forget_keys();
    assert_eq!(h.invoke("sqs-single.json").await, Vec::<String>::new());
    assert_eq!(h.provider.lookups(), ["ord-1001"]);
    assert_eq!(h.provider.calls_for("ord-1001").len(), 1, "nothing re-sent");
    let record = h.record("ord-1001").await.unwrap();
    assert_eq!(record.state, State::Done);
    assert_eq!(
        record.receipt,
        Some(h.provider.charges_for("ord-1001")[0].clone())
    );
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_key_older_than_the_provider_ttl_not_found_moves_to_the_next_attempt() {
    let h = harness().await;
    h.provider.script("ord-1001", &[Fault::Timeout]);
    h.invoke("sqs-single.json").await;
    h.clock.advance(Duration::from_secs(24 * 3600));
    h.provider.forget_keys();
    assert_eq!(h.invoke("sqs-single.json").await, Vec::<String>::new());
    assert_eq!(h.provider.lookups(), ["ord-1001"]);
    assert_eq!(
        h.provider.keys_for("ord-1001"),
        ["cobro#ord-1001#1", "cobro#ord-1001#2"]
    );
    assert_eq!(h.provider.charges_for("ord-1001").len(), 1);
    // The done record keeps only what a done order is read for: no attempt.
    let done = h.record("ord-1001").await.unwrap();
    assert_eq!(
        (done.state, done.attempt, done.sent),
        (State::Done, None, None)
    );
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_replayed_server_error_keeps_the_key_and_its_late_payment_completes_the_record() {
    let logs = Captured::default();
    let _guard = logs.install();
    let h = harness().await;
    h.provider
        .script("ord-1001", &[Fault::StoredServerErrorThenPayment]);
    // The in-invocation retry gets the stored 5xx replayed: the order is looked up,
    // nothing is found yet, and the record fails with the key kept: its payment may
    // still appear.
    assert_eq!(h.invoke("sqs-single.json").await.len(), 1);
    assert_eq!(h.provider.lookups(), ["ord-1001"]);
    assert_eq!(
        h.provider.keys_for("ord-1001"),
        ["cobro#ord-1001#1", "cobro#ord-1001#1"]
    );
    assert_eq!(outcome_lines(&logs).last().unwrap().1, "failed_retryable");
    // Stripe rolls the payment forward; the redelivery replays the key, finds it and
    // completes with it.
    h.provider.roll_forward("ord-1001");
    h.redeliver_later();
    assert!(h.invoke("sqs-single.json").await.is_empty());
    assert_eq!(outcome_lines(&logs).last().unwrap().1, "reconciled");
    assert!(
        h.provider
            .keys_for("ord-1001")
            .iter()
            .all(|k| k == "cobro#ord-1001#1")
    );
    assert_eq!(h.record("ord-1001").await.unwrap().state, State::Done);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn the_mixed_batch_acks_charges_and_duplicates_and_fails_only_the_invalid_record() {
    let h = harness().await;
    let failed = h.invoke("sqs-batch.json").await;
    assert_eq!(failed, message_ids("sqs-batch.json", &[5]));
    // The test provider charges every card (the simulator's test cards decline and
    // ask for authentication: tests/cli.rs).
    for order in ["ord-3001", "ord-3002", "ord-3003", "ord-3005", "ord-3006"] {
        assert_eq!(h.provider.charges_for(order).len(), 1, "{order}");
    }
    assert_eq!(h.provider.calls().len(), 5);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_record_without_a_message_id_fails_the_whole_batch() {
    let h = harness().await;
    let mut event = event("sqs-single.json");
    event.records[0].message_id = None;
    let result = h
        .consumer
        .run(&event, h.clock.now() + Duration::from_millis(60_000))
        .await;
    let err = result.expect_err("the batch cannot be judged");
    assert!(err.to_string().contains("messageId"), "{err}");
    assert!(h.provider.calls().is_empty());
    h.provider.assert_no_order_charged_twice();
}

/// The test harness always unwinds, whatever the profile says, so the panic test above
/// cannot prove the shipped binary unwinds; this guards the profile that builds it.
#[test]
fn the_release_profile_keeps_panic_unwind() {
    let manifest =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).unwrap();
    let release = manifest
        .split("\n[")
        .find(|section| section.starts_with("profile.release]"))
        .expect("[profile.release] in Cargo.toml");
    let panic_line = release
        .lines()
        .find(|line| line.trim_start().starts_with("panic"))
        .expect("[profile.release] sets panic explicitly");
    assert_eq!(
        panic_line.replace(' ', ""),
        "panic=\"unwind\"",
        "{panic_line}"
    );
}

#[tokio::test]
async fn an_emulator_deadline_that_is_not_an_epoch_falls_back_to_the_invoke_deadline() {
    let h = harness().await;
    let mut context = lambda_runtime::Context::default();
    // `cargo lambda watch` sends a duration (600000) where Lambda sends an epoch.
    context.deadline = 600_000;
    let event = lambda_runtime::LambdaEvent::new(event("sqs-single.json"), context);
    let response = h.consumer.handle(event).await.unwrap();
    assert!(response.batch_item_failures.is_empty());
    let record = h.record("ord-1001").await.unwrap();
    assert_eq!(record.state, State::Done);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn an_eventbridge_record_is_charged_and_its_raw_copy_is_a_duplicate() {
    let h = harness().await;
    let order = r#"{"id":"eb-1","amount":4200,"currency":"EUR","customer":"cus_1","payment_method":"pm_card_visa"}"#;
    let failed = h
        .invoke_event_with(
            batch_of(&[eventbridge(order), order.to_owned()]),
            INVOCATION,
        )
        .await;
    assert_eq!(failed, Vec::<String>::new());
    assert_eq!(h.provider.charges_for("eb-1").len(), 1);
    assert_eq!(
        h.provider.calls_for("eb-1").len(),
        1,
        "the copy sent nothing"
    );
    assert_eq!(h.record("eb-1").await.unwrap().state, State::Done);
}

#[tokio::test]
async fn each_outcome_line_carries_the_receive_count_and_the_trace_id() {
    let logs = Captured::default();
    let _guard = logs.install();
    let h = harness().await;
    let mut event = batch_of(&[
        r#"{"id":"tr-1","amount":100,"currency":"EUR","customer":"cus_1","payment_method":"pm_card_visa"}"#,
        "not an order",
    ]);
    for record in &mut event.records {
        record
            .attributes
            .insert("ApproximateReceiveCount".into(), "3".into());
        record.attributes.insert(
            "AWSTraceHeader".into(),
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1".into(),
        );
    }
    h.invoke_event_with(event, INVOCATION).await;
    let lines: Vec<serde_json::Value> = logs
        .text()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|l: &serde_json::Value| l["fields"]["outcome"].is_string())
        .collect();
    assert_eq!(lines.len(), 2, "{}", logs.text());
    for line in lines {
        assert_eq!(line["span"]["receive_count"], 3, "{line}");
        assert_eq!(
            line["span"]["trace_id"], "1-5759e988-bd862e3fe1be46a994272793",
            "{line}"
        );
    }
}

#[tokio::test]
async fn a_message_id_twice_in_a_batch_is_listed_once_in_the_failures() {
    let h = harness().await;
    let mut batch = batch_of(&["not json", r#"{"id":"x#y"}"#]);
    let id = batch.records[0].message_id.clone().unwrap();
    batch.records[1].message_id = Some(id.clone());
    assert_eq!(h.invoke_event_with(batch, INVOCATION).await, [id]);
}

#[tokio::test]
async fn declines_are_bounded_per_order_across_copies_and_deliveries() {
    let logs = Captured::default();
    let _guard = logs.install();
    let h = harness().await;
    h.provider.script("ord-1001", &[Fault::Decline; 6]);
    // Two copies of one order, delivered in turn: three declines in all reach the card.
    for copy in [
        event("sqs-single.json"),
        another_copy(),
        event("sqs-single.json"),
    ] {
        assert_eq!(h.invoke_event_with(copy, INVOCATION).await.len(), 1);
        h.redeliver_later();
    }
    assert_eq!(
        h.provider.keys_for("ord-1001"),
        ["cobro#ord-1001#1", "cobro#ord-1001#2", "cobro#ord-1001#3"]
    );
    // From now on any delivery of any copy fails as declined without a provider call.
    for copy in [another_copy(), event("sqs-single.json")] {
        assert_eq!(h.invoke_event_with(copy, INVOCATION).await.len(), 1);
        h.redeliver_later();
    }
    assert_eq!(
        h.provider.calls_for("ord-1001").len(),
        3,
        "no fourth try of the card"
    );
    let record = h.record("ord-1001").await.unwrap();
    assert_eq!(record.state, State::Free);
    assert_eq!(record.attempt, Some(4));
    let lines = outcome_lines(&logs);
    assert_eq!(lines.len(), 5);
    for (_, outcome, _, fields) in &lines[3..] {
        assert_eq!(outcome, "decline_limit");
        let reason = fields["reason"].as_str().unwrap_or("");
        assert!(reason.contains("limit"), "{fields}");
    }
    assert_eq!(h.provider.charge_count(), 0);
}

#[tokio::test]
async fn a_slow_store_cannot_make_the_handler_outlive_its_deadline() {
    let logs = Captured::default();
    let _guard = logs.install();
    // Each store call takes 1.5 s: reserve, charge and complete would end 3 s in.
    let options = Options {
        store_latency: Some(Duration::from_millis(1500)),
        wall_clock: true,
        ..Options::default()
    };
    let h = Harness::with(TestProvider::new(), options).await;
    let time_left = DEADLINE_MARGIN + Duration::from_millis(200);
    let failed = answers_before_the_deadline(&h, event("sqs-single.json"), time_left).await;
    assert_eq!(failed, message_ids("sqs-single.json", &[0]));
    let lines = outcome_lines(&logs);
    assert_eq!(lines[0].1, "deadline", "{:?}", lines[0].3);
    // Nothing is lost: the lease ends at the deadline and the next delivery charges.
    tokio::time::sleep(time_left).await;
    assert!(h.invoke("sqs-single.json").await.is_empty());
    assert_eq!(h.provider.charges_for("ord-1001").len(), 1);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_slow_listing_after_a_replayed_server_error_cannot_make_the_handler_outlive_its_deadline()
{
    let logs = Captured::default();
    let _guard = logs.install();
    let options = Options {
        wall_clock: true,
        ..Options::default()
    };
    let h = Harness::with(TestProvider::new(), options).await;
    // Attempt 1 stores a 500.
    h.provider.script("ord-1001", &[Fault::StoredServerError]);
    // The in-invocation retry gets the 500 replayed, which sends the record to the
    // listing, which takes most of the time.
    h.provider
        .delay_lookups(PAYMENT_TIMEOUT - Duration::from_millis(100));
    let time_left = DEADLINE_MARGIN + Duration::from_millis(600);
    let failed = answers_before_the_deadline(&h, event("sqs-single.json"), time_left).await;
    assert_eq!(failed.len(), 1);
    // Nothing found: the key is kept, and nothing else is sent.
    assert_eq!(outcome_lines(&logs).last().unwrap().1, "failed_retryable");
    assert_eq!(
        h.provider.keys_for("ord-1001"),
        ["cobro#ord-1001#1", "cobro#ord-1001#1"]
    );
    assert_eq!(h.provider.charge_count(), 0);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_pending_charge_at_the_provider_is_never_charged_again_under_a_new_key() {
    let logs = Captured::default();
    let _guard = logs.install();
    let h = harness().await;
    // Attempt 1's charge went out and the invocation died; the key is now old.
    h.provider.script("ord-1001", &[Fault::Timeout]);
    assert_eq!(h.invoke("sqs-single.json").await.len(), 1);
    h.provider.add_pending_charge("ord-1001", 5000);
    h.clock
        .advance(PROVIDER_KEY_TTL + Duration::from_secs(3600));
    let calls_before = h.provider.calls_for("ord-1001").len();

    assert!(
        h.invoke("sqs-single.json").await.is_empty(),
        "acknowledged: the record awaits the payment"
    );
    assert_eq!(
        h.provider.calls_for("ord-1001").len(),
        calls_before,
        "nothing is sent while the provider holds a live charge"
    );
    let record = h.record("ord-1001").await.unwrap();
    assert_eq!(record.state, State::Awaiting);
    assert_eq!(record.attempt, Some(1), "the same key");
    let (_, outcome, level, _) = outcome_lines(&logs).pop().unwrap();
    assert_eq!(
        (outcome.as_str(), level.as_str()),
        ("payment_processing", "INFO")
    );
}

/// A bank debit settles in days: the record awaits its `processing` payment (no DLQ
/// after the queue's receives), and the settler completes the order once it succeeded,
/// two weeks later.
#[tokio::test]
async fn a_processing_payment_that_succeeds_after_two_weeks_ends_done_with_no_dead_letter() {
    let logs = Captured::default();
    let _guard = logs.install();
    let h = harness().await;
    // The charge's answer was lost; the provider holds the debit `processing`.
    h.provider.script("ord-1001", &[Fault::Timeout]);
    assert_eq!(h.invoke("sqs-single.json").await.len(), 1);
    let debit = h.provider.add_processing_payment(&ord_1001());
    // The key is old: the next delivery looks the order's payments up first.
    h.clock
        .advance(PROVIDER_KEY_TTL + Duration::from_secs(3600));
    assert!(h.invoke("sqs-single.json").await.is_empty(), "acknowledged");
    assert_eq!(outcome_lines(&logs).pop().unwrap().1, "payment_processing");
    let record = h.record("ord-1001").await.unwrap();
    assert_eq!(
        (record.state, record.awaited.as_deref()),
        (State::Awaiting, Some(debit.as_str()))
    );
    // Delivered again while it settles: acknowledged, no call.
    let calls = h.provider.calls_for("ord-1001").len();
    h.redeliver_later();
    assert!(h.invoke("sqs-single.json").await.is_empty());
    assert_eq!(h.provider.calls_for("ord-1001").len(), calls);
    let settler = settler(&h.table, h.provider.as_ref(), &h.settings);
    // Fifteen days on, past the end of its wait (two weeks at least for a payment
    // the provider processes), still processing: it may still succeed, so nothing ends
    // (and nothing can cancel a processing payment).
    h.clock.advance(Duration::from_secs(15 * 24 * 3600));
    let run = settler.run().await.unwrap();
    assert_eq!((run.read, run.waiting, run.ended), (1, 1, 0), "{run:?}");
    assert!(h.provider.cancels().is_empty());
    // The bank pays: the next run completes the order.
    assert!(h.provider.settle_processing(&debit, true));
    let run = settler.run().await.unwrap();
    assert_eq!((run.read, run.completed), (1, 1), "{run:?}");
    let done = h.record("ord-1001").await.unwrap();
    assert_eq!(
        (done.state, done.receipt.as_deref()),
        (State::Done, Some(debit.as_str()))
    );
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn resolve_refuses_to_move_to_a_new_key_while_the_charge_is_pending() {
    let h = harness().await;
    h.provider.script("ord-1001", &[Fault::Timeout]);
    assert_eq!(h.invoke("sqs-single.json").await.len(), 1);
    h.provider.add_pending_charge("ord-1001", 5000);
    h.redeliver_later();
    let resolved = resolve(
        h.table.store.as_ref(),
        h.provider.as_ref(),
        &h.settings,
        &ord_1001(),
        Confirmed::default(),
    )
    .await;
    assert!(
        matches!(resolved, Err(ResolveError::Pending { ref status, .. }) if status == "pending"),
        "{resolved:?}"
    );
    let record = h.record("ord-1001").await.unwrap();
    assert_eq!((record.state, record.attempt), (State::Free, Some(1)));
    assert_eq!(h.provider.charge_count(), 0);
}

#[tokio::test]
async fn resolve_with_retry_declined_lets_a_declined_order_try_the_card_again() {
    let h = harness().await;
    h.provider.script("ord-1001", &[Fault::Decline; 3]);
    for _ in 0..4 {
        assert_eq!(h.invoke("sqs-single.json").await.len(), 1);
        h.redeliver_later();
    }
    assert_eq!(h.provider.calls_for("ord-1001").len(), 3, "the limit holds");
    // Without --retry-declined, resolve releases with a new key but keeps the count.
    let confirmed = Confirmed::default();
    let order = ord_1001();
    let settle = |confirmed| {
        resolve(
            h.table.store.as_ref(),
            h.provider.as_ref(),
            &h.settings,
            &order,
            confirmed,
        )
    };
    assert!(matches!(
        settle(confirmed).await.unwrap(),
        Resolution::Released { next_attempt: 5 }
    ));
    assert_eq!(h.invoke("sqs-single.json").await.len(), 1);
    assert_eq!(h.provider.calls_for("ord-1001").len(), 3);
    // The customer fixed the card.
    let retry = Confirmed {
        retry_declined: true,
        ..Confirmed::default()
    };
    assert!(matches!(
        settle(retry).await.unwrap(),
        Resolution::Released { next_attempt: 6 }
    ));
    assert!(h.invoke("sqs-single.json").await.is_empty());
    assert_eq!(
        h.provider.keys_for("ord-1001").last().unwrap(),
        "cobro#ord-1001#6"
    );
    assert_eq!(h.provider.charges_for("ord-1001").len(), 1);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn once_the_providers_breaker_opens_records_are_deferred_without_a_write_until_a_probe() {
    let logs = Captured::default();
    let _guard = logs.install();
    let options = Options {
        breaker_threshold: Some(2),
        ..Options::default()
    };
    let h = Harness::with(TestProvider::new(), options).await;
    // A customer each: one customer's orders run one after another, and the probe
    // must be out while the other record is admitted.
    let body = |id: &str| {
        let customer = id.replace('-', "_");
        format!(
            r#"{{"id":"{id}","amount":700,"currency":"EUR","customer":"cus_{customer}","payment_method":"pm_card_visa"}}"#
        )
    };
    // A 5xx and its in-invocation retry: two failures in a row open the breaker.
    h.provider
        .script("brk-1", &[Fault::ServerError, Fault::ServerError]);
    let event = batch_of(&[body("brk-1")]);
    assert_eq!(h.invoke_event_with(event, INVOCATION).await.len(), 1);
    // The next order is deferred: no provider call, no reservation.
    let event = batch_of(&[body("brk-2")]);
    assert_eq!(h.invoke_event_with(event, INVOCATION).await.len(), 1);
    assert!(h.provider.calls_for("brk-2").is_empty());
    assert!(
        h.record("brk-2").await.is_none(),
        "a deferred record is not reserved"
    );
    let deferred = outcome_lines(&logs);
    let (_, outcome, level, fields) = deferred.last().unwrap();
    assert_eq!((outcome.as_str(), level.as_str()), ("deferred", "WARN"));
    // Deferred with the backoff of a first receive (the upper half of 30 s), capped by
    // the breaker's next probe (30 s away) plus at most 5 s.
    let retry = fields["retry_in_s"].as_u64().unwrap();
    assert!((15..=30).contains(&retry), "{fields}");
    // After the open period (RETRY_BASE, 30 s) one record probes; the others of its
    // batch are deferred while it is out.
    h.clock.advance(Duration::from_secs(31));
    let event = batch_of(&[body("brk-2"), body("brk-3")]);
    assert_eq!(h.invoke_event_with(event, INVOCATION).await.len(), 1);
    let charged: usize = ["brk-2", "brk-3"]
        .map(|id| h.provider.charges_for(id).len())
        .iter()
        .sum();
    assert_eq!(charged, 1, "one probe");
    // Its success closed the breaker: the deferred one goes through.
    let event = batch_of(&[body("brk-2"), body("brk-3")]);
    assert!(h.invoke_event_with(event, INVOCATION).await.is_empty());
    assert_eq!(h.provider.charges_for("brk-2").len(), 1);
    assert_eq!(h.provider.charges_for("brk-3").len(), 1);
    h.provider.assert_no_order_charged_twice();
}
