//! Orders that await their customer: authentication, Stripe's events (fetched, never
//! believed), the settler.

use super::*;
use charge_once::domain::{ForOrder, OrderKey};

#[tokio::test]
async fn a_declined_payment_is_cancelled_before_the_next_key_so_no_later_confirm_can_charge_twice()
{
    let h = harness().await;
    h.provider.script("pi-dec", &[Fault::Decline]);
    let event = batch_of(&[paid("pi-dec")]);
    assert_eq!(
        h.invoke_event_with(event.clone(), INVOCATION).await.len(),
        1
    );
    // The declined payment was looked up and cancelled before the record moved on.
    let cancelled = h.provider.cancels();
    assert_eq!(cancelled.len(), 1, "{cancelled:?}");
    assert!(h.provider.open_for("pi-dec").is_empty());
    let record = h.record("pi-dec").await.unwrap();
    assert_eq!((record.state, record.attempt), (State::Free, Some(2)));
    // The shop's page or a person in the Dashboard cannot confirm it any more.
    assert!(!h.provider.confirm(&cancelled[0]));
    h.redeliver_later();
    assert!(h.invoke_event_with(event, INVOCATION).await.is_empty());
    assert_eq!(
        h.provider.keys_for("pi-dec"),
        ["cobro#pi-dec#1", "cobro#pi-dec#2"]
    );
    assert_eq!(h.provider.charges_for("pi-dec").len(), 1);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn authentication_required_acknowledges_the_order_which_awaits_its_customer_with_no_other_call_until_the_event_of_the_confirmed_payment_completes_it()
 {
    let logs = Captured::default();
    let _guard = logs.install();
    let h = harness().await;
    h.provider
        .script("pi-sca", &[Fault::AuthenticationRequired]);
    let event = batch_of(&[paid("pi-sca")]);
    assert!(
        h.invoke_event_with(event.clone(), INVOCATION)
            .await
            .is_empty(),
        "acknowledged: no DLQ"
    );
    let open = h.provider.open_for("pi-sca");
    assert_eq!(open.len(), 1, "the payment awaits the customer");
    let lines = outcome_lines(&logs);
    let (_, outcome, level, fields) = lines.last().unwrap();
    assert_eq!(
        (outcome.as_str(), level.as_str()),
        ("authentication_required", "INFO")
    );
    assert_eq!(fields["payment"], open[0].as_str(), "{fields}");
    let record = h.record("pi-sca").await.unwrap();
    assert_eq!((record.state, record.attempt), (State::Awaiting, Some(1)));
    assert_eq!(record.awaited.as_deref(), Some(open[0].as_str()));
    let wait_until = record.wait_until.unwrap();
    assert_eq!(
        wait_until.as_secs(),
        (h.now() + harness::rig::AUTHENTICATION_WAIT).as_secs()
    );
    // Delivered again while it waits: a duplicate, no provider call.
    h.redeliver_later();
    assert!(
        h.invoke_event_with(event.clone(), INVOCATION)
            .await
            .is_empty()
    );
    assert_eq!(outcome_lines(&logs).last().unwrap().1, "awaiting_customer");
    assert_eq!(h.provider.keys_for("pi-sca"), ["cobro#pi-sca#1"]);
    assert!(h.provider.cancels().is_empty(), "it is never cancelled");
    // The customer authenticates on the shop's page; Stripe's event completes it.
    assert!(h.provider.confirm(&open[0]));
    let succeeded = stripe_event("payment_intent.succeeded", &open[0], "succeeded", "pi-sca");
    assert!(
        h.invoke_event_with(batch_of(&[succeeded]), INVOCATION)
            .await
            .is_empty()
    );
    assert_eq!(outcome_lines(&logs).last().unwrap().1, "reconciled");
    assert_eq!(h.provider.keys_for("pi-sca"), ["cobro#pi-sca#1"]);
    assert_eq!(h.provider.charges_for("pi-sca"), open);
    let done = h.record("pi-sca").await.unwrap();
    assert_eq!(done.state, State::Done);
    assert_eq!(done.receipt.as_deref(), Some(open[0].as_str()));
    // A later delivery of the order is a duplicate of a done order.
    h.redeliver_later();
    assert!(h.invoke_event_with(event, INVOCATION).await.is_empty());
    assert_eq!(h.provider.keys_for("pi-sca"), ["cobro#pi-sca#1"]);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_message_without_a_payment_method_is_invalid_and_never_charged() {
    let h = harness().await;
    let unpaid = batch_of(&[unpaid("pi-none")]);
    // Failed alone (dead-lettered by the batch: tests/queue.rs), with the reason
    // `domain/order.rs`'s tests name.
    assert_eq!(h.invoke_event_with(unpaid, INVOCATION).await.len(), 1);
    assert!(h.provider.calls_for("pi-none").is_empty(), "never charged");
    assert!(h.record("pi-none").await.is_none(), "nothing written");
}

#[tokio::test]
async fn a_succeeded_event_completes_the_order_that_awaits_its_customer_and_a_repeat_changes_nothing()
 {
    let logs = Captured::default();
    let _guard = logs.install();
    let events = Events::new().await;
    let payment = events.awaiting(1).await;
    assert_eq!(last_outcome(&logs).0, "authentication_required");
    localstripe::authenticate(&payment).await;
    let succeeded = events.event("payment_intent.succeeded", &payment).await;

    let h = &events.h;
    assert!(
        h.invoke_event_with(succeeded.clone(), INVOCATION)
            .await
            .is_empty()
    );
    let (outcome, fields) = last_outcome(&logs);
    assert_eq!(outcome, "reconciled", "{fields}");
    let done = h.record(&events.order_id(1)).await.unwrap();
    assert_eq!(done.state, State::Done);
    assert_eq!(done.receipt.as_deref(), Some(payment.as_str()));
    assert_eq!(
        done.wait_until, None,
        "the record leaves the awaiting index"
    );

    // The same event again (EventBridge and SQS deliver at least once): refused by its
    // condition, nothing written.
    assert!(h.invoke_event_with(succeeded, INVOCATION).await.is_empty());
    assert_eq!(last_outcome(&logs).0, "event_ignored");
    assert_eq!(h.record(&events.order_id(1)).await.unwrap(), done);
    assert_eq!(
        localstripe::succeeded_of(&events.payer.customer).await,
        [payment]
    );
    events.done().await;
}

/// An event that names no order (its PaymentIntent's metadata left out, as a thin
/// event carries only the id) settles the order the provider's answer names: it runs as
/// any record does, alone on its chain, never left unrun.
#[tokio::test]
async fn an_event_that_names_no_order_settles_the_order_the_providers_answer_names() {
    let logs = Captured::default();
    let _guard = logs.install();
    let events = Events::new().await;
    let payment = events.awaiting(1).await;
    localstripe::authenticate(&payment).await;
    let mut thin = events.event("payment_intent.succeeded", &payment).await;
    let body = thin.records[0].body.as_deref().unwrap();
    let mut body: serde_json::Value = serde_json::from_str(body).unwrap();
    let object = &mut body["detail"]["data"]["object"];
    assert!(object.as_object_mut().unwrap().remove("metadata").is_some());
    thin.records[0].body = Some(body.to_string());

    assert!(
        events
            .h
            .invoke_event_with(thin, INVOCATION)
            .await
            .is_empty()
    );
    let (outcome, fields) = last_outcome(&logs);
    assert_eq!(outcome, "reconciled", "{fields}");
    let done = events.h.record(&events.order_id(1)).await.unwrap();
    assert_eq!(
        (done.state, done.receipt.as_deref()),
        (State::Done, Some(payment.as_str()))
    );
    events.done().await;
}

/// A success of a payment the awaiting record does not name: Stripe took money for the
/// order while another of its payments may still succeed, so a person looks.
#[tokio::test]
async fn a_success_of_a_payment_the_awaiting_record_does_not_name_is_dead_lettered_and_the_wait_goes_on()
 {
    let logs = Captured::default();
    let _guard = logs.install();
    let events = Events::new().await;
    let awaited = events.awaiting(1).await;
    // Another PaymentIntent names the same order: made elsewhere, confirmed.
    let other = events.open_payment(1).await;
    localstripe::authenticate(&other).await;
    let succeeded = events.event("payment_intent.succeeded", &other).await;
    let before = events.h.record(&events.order_id(1)).await.unwrap();
    assert_eq!(
        events
            .h
            .invoke_event_with(succeeded, INVOCATION)
            .await
            .len(),
        1,
        "to the DLQ, never acknowledged as nothing"
    );
    let (outcome, fields) = last_outcome(&logs);
    assert_eq!(outcome, "needs_reconciliation", "{fields}");
    assert!(
        fields["reason"]
            .as_str()
            .is_some_and(|r| r.contains(&other) && r.contains("awaits another payment")),
        "{fields}"
    );
    let after = events.h.record(&events.order_id(1)).await.unwrap();
    assert_eq!(after, before);
    assert_eq!(after.awaited.as_deref(), Some(awaited.as_str()));
    events.done().await;
}

#[tokio::test]
async fn a_payment_failed_event_leaves_the_order_awaiting_its_customer() {
    let logs = Captured::default();
    let _guard = logs.install();
    let events = Events::new().await;
    let payment = events.awaiting(1).await;
    // Stripe sends one for the very answer that started the wait.
    let failed = events
        .event("payment_intent.payment_failed", &payment)
        .await;
    let before = events.h.record(&events.order_id(1)).await.unwrap();
    assert!(
        events
            .h
            .invoke_event_with(failed, INVOCATION)
            .await
            .is_empty()
    );
    assert_eq!(last_outcome(&logs).0, "event_ignored");
    assert_eq!(events.h.record(&events.order_id(1)).await.unwrap(), before);
    // The customer can still confirm it, and its event completes the order.
    localstripe::authenticate(&payment).await;
    let succeeded = events.event("payment_intent.succeeded", &payment).await;
    assert!(
        events
            .h
            .invoke_event_with(succeeded, INVOCATION)
            .await
            .is_empty()
    );
    events.assert_done_with(&events.order_id(1), &payment).await;
    events.done().await;
}

#[tokio::test]
async fn a_canceled_event_ends_the_wait_reports_the_order_and_its_next_message_starts_a_new_attempt()
 {
    let logs = Captured::default();
    let _guard = logs.install();
    let mut events = Events::new().await;
    let reports = events.queues.create_report_queue().await;
    events.h = events.h.reporting_to(std::sync::Arc::new(SqsReports::new(
        events.queues.client.clone(),
        &reports,
    )));
    let payment = events.awaiting(1).await;
    // Cancelled in the Dashboard, say.
    events.cancel(&payment).await;
    let canceled = events.event("payment_intent.canceled", &payment).await;
    assert!(
        events
            .h
            .invoke_event_with(canceled.clone(), INVOCATION)
            .await
            .is_empty()
    );
    assert_eq!(last_outcome(&logs).0, "authentication_expired");
    let ended = events.h.record(&events.order_id(1)).await.unwrap();
    assert_eq!((ended.state, ended.attempt), (State::Failed, Some(2)));
    let sent = events.queues.drain_reports(&reports).await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    let report = &sent[0];
    assert_eq!(report["order_id"], events.order_id(1).as_str());
    assert_eq!(report["outcome"], "authentication_expired");
    assert_eq!(report["payment_id"], payment.as_str());
    // The same event again: the wait already ended, nothing reported again.
    assert!(
        events
            .h
            .invoke_event_with(canceled, INVOCATION)
            .await
            .is_empty()
    );
    assert_eq!(last_outcome(&logs).0, "event_ignored");
    // The shop sends the order again: a new attempt, a new PaymentIntent.
    let again = events.awaiting(1).await;
    assert_ne!(again, payment);
    let record = events.h.record(&events.order_id(1)).await.unwrap();
    assert_eq!(record.attempt, Some(2));
    events.done().await;
}

#[tokio::test]
async fn an_event_that_arrives_while_the_order_is_leased_is_retried_and_completes_it_once_the_record_awaits()
 {
    let logs = Captured::default();
    let _guard = logs.install();
    let events = Events::new().await;
    let id = events.order_id(1);
    // Another invocation holds the order, has made its PaymentIntent, and has not yet
    // written that it awaits the customer, who confirms meanwhile.
    let body = events.order(1).records[0].body.clone().unwrap();
    let order = Order::parse(&body).unwrap();
    let other = "another-invocation";
    Lease::of(&order, other, events.h.now())
        .make(events.h.store.as_ref())
        .await;
    let payment = events.open_payment(1).await;
    localstripe::authenticate(&payment).await;
    let succeeded = events.event("payment_intent.succeeded", &payment).await;
    let failed = events
        .h
        .invoke_event_with(succeeded.clone(), INVOCATION)
        .await;
    assert_eq!(failed.len(), 1, "retried");
    assert_eq!(last_outcome(&logs).0, "in_progress");
    assert_eq!(events.h.record(&id).await.unwrap().state, State::InProgress);
    // The other invocation writes its wait; the event's retry completes the order.
    let key = Key::for_order_id(&id);
    let written = events
        .h
        .store
        .write(&Write::Await(AwaitRequest {
            pk: &key,
            owner: &Owner::new(other),
            awaited: &payment,
            wait_until: events.h.now() + Duration::from_secs(7 * 24 * 3600),
            expires: events.h.now() + Duration::from_secs(97 * 24 * 3600),
        }))
        .await
        .unwrap();
    assert!(matches!(written, WriteOutcome::Applied(_)), "{written:?}");
    assert!(
        events
            .h
            .invoke_event_with(succeeded, INVOCATION)
            .await
            .is_empty()
    );
    events.assert_done_with(&id, &payment).await;
    events.done().await;
}

#[tokio::test]
async fn a_late_confirmation_of_an_old_payment_for_an_order_already_paid_is_dead_lettered_as_charged_twice()
 {
    let logs = Captured::default();
    let _guard = logs.install();
    let events = Events::new().await;
    let old = events.awaiting(1).await;
    // Meanwhile the order was paid with another PaymentIntent.
    let paid = events.open_payment(1).await;
    localstripe::authenticate(&paid).await;
    let key = Key::for_order_id(&events.order_id(1));
    let awaiting = events.h.record(&events.order_id(1)).await.unwrap();
    events
        .h
        .table
        .put_item(schema::attributes(&Record {
            state: State::Done,
            receipt: Some(paid.clone()),
            awaited: None,
            wait_until: None,
            owner: None,
            lease_until: None,
            ..awaiting
        }))
        .await;
    // Then the customer confirms the old one, from an old page.
    localstripe::authenticate(&old).await;
    let late = events.event("payment_intent.succeeded", &old).await;
    let failed = events.h.invoke_event_with(late, INVOCATION).await;
    assert_eq!(failed.len(), 1, "to the DLQ: a person refunds one");
    let (outcome, fields) = last_outcome(&logs);
    assert_eq!(outcome, "needs_reconciliation", "{fields}");
    let record = events.h.record(&events.order_id(1)).await.unwrap();
    assert_eq!(record.pk, key);
    assert_eq!(
        (record.state, record.receipt.as_deref()),
        (State::Done, Some(paid.as_str()))
    );
    let mut succeeded = localstripe::succeeded_of(&events.payer.customer).await;
    succeeded.sort();
    let mut both = vec![old, paid];
    both.sort();
    assert_eq!(succeeded, both, "charged twice");
    events.done().await;
}

#[tokio::test]
async fn a_customer_who_confirms_after_the_fourteen_days_a_dead_letter_is_kept_still_ends_with_the_order_recorded()
 {
    let wait = Duration::from_secs(20 * 24 * 3600);
    let events = Events::with(Options {
        authentication_wait: Some(wait),
        ..Options::default()
    })
    .await;
    let h = &events.h;
    let by_event = events.awaiting(1).await;
    let by_settler = events.awaiting(2).await;
    let started = h.now();
    assert_eq!(
        h.record(&events.order_id(1))
            .await
            .unwrap()
            .wait_until
            .map(|t| t.as_secs()),
        Some((started + wait).as_secs())
    );
    // Fifteen days on: an SQS queue keeps a message 14 days at most, so a dead letter
    // of either order would be gone; only the table holds them.
    h.clock.advance(Duration::from_secs(15 * 24 * 3600));
    let settler = settler(&h.table, h.provider.as_ref(), &h.settings);
    let before = settler.run().await.unwrap();
    assert_eq!(
        (before.read, before.waiting, before.ended),
        (2, 2, 0),
        "{before:?}"
    );
    // Both customers come back and confirm.
    localstripe::authenticate(&by_event).await;
    localstripe::authenticate(&by_settler).await;
    // The first order's event completes it; the second's is lost, and the settler's
    // next run completes that order from its payment.
    let succeeded = events.event("payment_intent.succeeded", &by_event).await;
    assert!(h.invoke_event_with(succeeded, INVOCATION).await.is_empty());
    let after = settler.run().await.unwrap();
    assert_eq!(
        (after.read, after.completed, after.ended),
        (1, 1, 0),
        "{after:?}"
    );
    for (n, payment) in [(1, &by_event), (2, &by_settler)] {
        let record = h.record(&events.order_id(n)).await.unwrap();
        assert_eq!(record.state, State::Done, "{record:?}");
        assert_eq!(
            record.receipt.as_deref(),
            Some(payment.as_str()),
            "{record:?}"
        );
    }
    let mut succeeded = localstripe::succeeded_of(&events.payer.customer).await;
    succeeded.sort();
    let mut both = vec![by_event.clone(), by_settler.clone()];
    both.sort();
    assert_eq!(succeeded, both, "one PaymentIntent per order");
    events.done().await;
}

/// Anyone allowed to send to the orders queue can write a body that looks like Stripe's
/// event: a forged success or cancellation of an awaited payment changes nothing, since
/// the consumer asks Stripe, and the customer's real confirmation completes the order
/// with one payment.
#[tokio::test]
async fn a_forged_success_or_cancellation_of_an_awaited_payment_changes_nothing_and_the_customer_still_pays_once()
 {
    let logs = Captured::default();
    let _guard = logs.install();
    let events = Events::new().await;
    let id = events.order_id(1);
    let payment = events.awaiting(1).await;
    let before = events.h.record(&id).await.unwrap();
    for (kind, status) in [
        ("payment_intent.succeeded", "succeeded"),
        ("payment_intent.canceled", "canceled"),
    ] {
        let forged = batch_of(&[stripe_event(kind, &payment, status, &id)]);
        assert!(
            events
                .h
                .invoke_event_with(forged, INVOCATION)
                .await
                .is_empty()
        );
        let (outcome, fields) = last_outcome(&logs);
        assert_eq!(outcome, "event_ignored", "{kind}: {fields}");
        assert_eq!(events.h.record(&id).await.unwrap(), before, "{kind}");
    }
    // The customer confirms: Stripe's own event completes the order.
    localstripe::authenticate(&payment).await;
    let succeeded = events.event("payment_intent.succeeded", &payment).await;
    assert!(
        events
            .h
            .invoke_event_with(succeeded, INVOCATION)
            .await
            .is_empty()
    );
    events.assert_done_with(&id, &payment).await;
    assert_eq!(
        localstripe::succeeded_of(&events.payer.customer).await,
        [payment]
    );
    events.done().await;
}

/// Stripe's own success for an order whose record does not await it (released after a
/// lost answer, or a wait that ended) completes the order: money taken is never
/// acknowledged as nothing.
#[tokio::test]
async fn a_genuine_success_for_a_released_or_ended_record_completes_the_order() {
    let logs = Captured::default();
    let _guard = logs.install();
    let events = Events::new().await;
    for (n, state) in [(1, State::Free), (2, State::Failed)] {
        let id = events.order_id(n);
        let body = events.order(n).records[0].body.clone().unwrap();
        let order = Order::parse(&body).unwrap();
        events
            .h
            .table
            .put_item(schema::attributes(&Record {
                fingerprint: Some(charge_once::domain::Fingerprint::for_order(&order)),
                attempt: Some(1),
                created: Some(events.h.now()),
                expires: Some(events.h.now() + Duration::from_secs(30 * 24 * 3600)),
                ..Record::new(Key::for_order_id(&id), state.clone())
            }))
            .await;
        let payment = events.open_payment(n).await;
        localstripe::authenticate(&payment).await;
        let succeeded = events.event("payment_intent.succeeded", &payment).await;
        assert!(
            events
                .h
                .invoke_event_with(succeeded, INVOCATION)
                .await
                .is_empty(),
            "{state:?}"
        );
        let (outcome, fields) = last_outcome(&logs);
        assert_eq!(outcome, "reconciled", "{state:?}: {fields}");
        events.assert_done_with(&id, &payment).await;
    }
    events.done().await;
}

/// Stripe never deletes a PaymentIntent: one it does not know means a wrong key, mode
/// or URL. The settler ends no wait on it and says which setting to check; the event
/// path retries.
#[tokio::test]
async fn a_payment_the_provider_does_not_know_ends_no_wait_and_the_run_names_the_setting_to_check()
{
    let logs = Captured::default();
    let _guard = logs.install();
    let events = Events::new().await;
    let h = &events.h;
    let id = events.order_id(1);
    let unknown = format!("pi_unknown{}", &events.run[2..]);
    let awaiting = Record {
        fingerprint: Some(charge_once::domain::Fingerprint::new("f")),
        attempt: Some(1),
        awaited: Some(unknown.clone()),
        wait_until: Some(h.now() - Duration::from_secs(60)),
        expires: Some(h.now() + Duration::from_secs(30 * 24 * 3600)),
        ..Record::new(Key::for_order_id(&id), State::Awaiting)
    };
    h.table.put_item(schema::attributes(&awaiting)).await;
    let settler = settler(&h.table, h.provider.as_ref(), &h.settings);
    let run = settler.run().await.unwrap();
    assert_eq!(
        (run.missing, run.ended, run.completed),
        (1, 0, 0),
        "{run:?}"
    );
    assert_eq!(run.summary()["settle"], "incomplete");
    assert_eq!(h.record(&id).await.unwrap(), awaiting, "nothing ended");
    let text = logs.text();
    let line = text
        .lines()
        .find(|l| l.contains("does not have the payment"))
        .expect("the fault's line");
    assert!(
        line.contains("\"ERROR\"") && line.contains("PAYMENT_API_URL"),
        "{line}"
    );
    // An event naming it is retried, at error level, and ends nothing either.
    let event = batch_of(&[stripe_event(
        "payment_intent.canceled",
        &unknown,
        "canceled",
        &id,
    )]);
    assert_eq!(h.invoke_event_with(event, INVOCATION).await.len(), 1);
    let (outcome, fields) = last_outcome(&logs);
    assert_eq!(outcome, "failed_retryable", "{fields}");
    assert_eq!(h.record(&id).await.unwrap(), awaiting);
    events.done().await;
}

/// Waits that stay open fill the head of the awaiting index; a wait behind more than
/// one run's worth of them is still reached: each run goes on from where the last one
/// stopped, and a run that could not go round says `incomplete`.
#[tokio::test]
async fn the_settler_reaches_a_wait_behind_more_than_one_runs_worth_of_open_waits() {
    let h = harness().await;
    let ids: Vec<String> = (1..=5).map(|n| format!("pg-{n}")).collect();
    for id in &ids {
        h.provider.script(id, &[Fault::AuthenticationRequired]);
        assert!(
            h.invoke_event_with(batch_of(&[paid(id)]), INVOCATION)
                .await
                .is_empty()
        );
        // Each wait ends a minute after the one before: the last is last in the index.
        h.clock.advance(Duration::from_secs(60));
    }
    let last = h.record("pg-5").await.unwrap().awaited.unwrap();
    assert!(h.provider.confirm(&last), "its customer confirms");
    let settler = Settler {
        limit: 2,
        per_run: 2,
        ..settler(&h.table, h.provider.as_ref(), &h.settings)
    };
    for _ in 0..2 {
        let run = settler.run().await.unwrap();
        assert_eq!((run.read, run.waiting, run.completed), (2, 2, 0), "{run:?}");
        assert_eq!(run.summary()["settle"], "incomplete");
    }
    let run = settler.run().await.unwrap();
    assert_eq!(run.completed, 1, "{run:?}");
    let done = h.record("pg-5").await.unwrap();
    assert_eq!(
        (done.state, done.receipt.as_deref()),
        (State::Done, Some(last.as_str()))
    );
    // Round the whole index in one run: `done`.
    let everything = Settler {
        per_run: usize::MAX,
        ..settler
    };
    let run = everything.run().await.unwrap();
    assert_eq!((run.read, run.waiting), (4, 4), "{run:?}");
    assert_eq!(run.summary()["settle"], "done");
    h.provider.assert_no_order_charged_twice();
}

/// The table may hold another consumer's facts under their own prefix (a refund's
/// wait, say): the settler reads them in the awaiting index and leaves them alone,
/// asking the payment provider nothing about them.
#[tokio::test]
async fn the_settler_leaves_another_consumers_waits_alone() {
    use charge_once::contracts::store::ReserveRequest;
    use charge_once::domain::Fingerprint;
    let h = harness().await;
    let (key, owner, print) = (
        Key::new("reembolso#", "r-1"),
        Owner::new("another consumer"),
        Fingerprint::new("f"),
    );
    let now = h.settings.now();
    let reserve = Write::Reserve(ReserveRequest {
        pk: &key,
        fingerprint: &print,
        owner: &owner,
        now,
        lease_until: now + Duration::from_secs(60),
        expires: now + Duration::from_secs(3600),
        max_refusals: 3,
    });
    let wait = Write::Await(AwaitRequest {
        pk: &key,
        owner: &owner,
        awaited: "re_1",
        // Its wait already over: the settler would cancel an order's payment now.
        wait_until: now,
        expires: now + Duration::from_secs(3600),
    });
    for write in [reserve, wait] {
        let written = h.table.store.write(&write).await.unwrap();
        assert!(matches!(written, WriteOutcome::Applied(_)), "{written:?}");
    }
    let before = h.table.store.get(&key).await.unwrap().unwrap();
    assert_eq!(before.state, State::Awaiting);
    h.clock.advance(Duration::from_secs(60));

    let run = settler(&h.table, h.provider.as_ref(), &h.settings)
        .run()
        .await
        .unwrap();
    assert_eq!((run.read, run.completed, run.failed), (0, 0, 0), "{run:?}");
    assert_eq!(h.table.store.get(&key).await.unwrap().unwrap(), before);
    assert!(h.provider.calls().is_empty(), "nothing asked about it");
}
