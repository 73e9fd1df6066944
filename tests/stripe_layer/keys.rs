//! Idempotency keys on both servers: replays, reuse with another body, two at once,
//! declines and server errors replayed, keys in flight, per API key.

use super::*;

#[tokio::test]
async fn the_same_key_and_body_replay_the_first_charge_on_both_servers() {
    let mock = replayed_once(Server::StripeMock).await;
    let layer = replayed_once(Server::Layer).await;
    let expected = vec![answer(200, false, Some(0)), answer(200, true, Some(0))];
    assert_eq!(mock, (expected, 1));
    assert_eq!(layer, mock);
}

#[tokio::test]
async fn a_key_reused_with_another_amount_is_refused_and_the_first_answer_stays_on_both_servers() {
    let mock = reused_with_another_amount(Server::StripeMock).await;
    let layer = reused_with_another_amount(Server::Layer).await;
    let expected = vec![
        answer(200, false, Some(0)),
        refused(400, "idempotency_error", None),
        answer(200, true, Some(0)),
    ];
    assert_eq!(mock, (expected, 1));
    assert_eq!(layer, mock);
}

/// Both servers answer a request completely before they read the next one, so two
/// requests sent at once are never in flight together: one is the original, the other
/// its replay (the 409 of a request in flight is the layer's own test below).
#[tokio::test]
async fn two_requests_sent_at_once_under_one_key_make_one_charge_on_both_servers() {
    let mock = two_at_once(Server::StripeMock).await;
    let layer = two_at_once(Server::Layer).await;
    let expected = vec![answer(200, false, Some(0)), answer(200, true, Some(0))];
    assert_eq!(mock, (expected, 1));
    assert_eq!(layer, mock);
}

#[tokio::test]
async fn a_decline_is_replayed_under_its_key_with_the_same_declined_charge_on_both_servers() {
    let mut mock = declined_twice(Server::StripeMock).await;
    let mut layer = declined_twice(Server::Layer).await;
    // localstripe's own error type for a decline (Stripe's and the mock's is
    // `card_error`); the layer passes it through. Everything else must agree.
    for ((answers, _), error_type) in [
        (&mut mock, "card_error"),
        (&mut layer, "invalid_request_error"),
    ] {
        for answer in answers.iter_mut() {
            assert_eq!(answer.error_type.take().as_deref(), Some(error_type));
        }
    }
    let declined = |replayed| Answer {
        error_code: Some("card_declined".to_owned()),
        ..answer(402, replayed, Some(0))
    };
    assert_eq!(mock, (vec![declined(false), declined(true)], 1));
    assert_eq!(layer, mock);
}

/// Stripe keeps the answer of a request that reached an endpoint, "including 500
/// errors"; so do the mock and the layer.
#[tokio::test]
async fn a_server_error_is_replayed_under_its_key_on_both_servers() {
    let mock = server_error_twice(Server::StripeMock).await;
    let layer = server_error_twice(Server::Layer).await;
    assert_eq!(mock, [answer(500, false, None), answer(500, true, None)]);
    assert_eq!(layer, mock);
}

#[tokio::test]
async fn a_request_whose_key_is_in_flight_is_refused_with_409_and_nothing_is_stored() {
    let customer = Server::Layer.customer(false).await;
    let key = unique("in-flight");
    let hold = unique("hold");
    let held = Call {
        hold: Some(hold.clone()),
        ..Call::key(&key)
    };
    let first = tokio::spawn({
        let customer = customer.clone();
        async move { Server::Layer.charge(&held, &customer, "1000").await }
    });
    assert_eq!(
        holds(reqwest::Method::GET, &hold).await,
        204,
        "the first request holds its key"
    );
    let during = Server::Layer
        .charge(&Call::key(&key), &customer, "1000")
        .await;
    assert_eq!(holds(reqwest::Method::DELETE, &hold).await, 204);
    let first = first.await.unwrap();
    let after = Server::Layer
        .charge(&Call::key(&key), &customer, "1000")
        .await;
    assert_eq!(
        answers(&[first, during, after]),
        [
            answer(200, false, Some(0)),
            refused(409, "invalid_request_error", Some("idempotency_key_in_use")),
            answer(200, true, Some(0)),
        ]
    );
    assert_eq!(Server::Layer.charges_of(&customer).await, 1);
}

/// stripe-stateful-mock keeps keys per account and per path, so a key on another path
/// is a new request there; Stripe refuses it, and so does the layer.
#[tokio::test]
async fn a_key_belongs_to_one_api_key_and_one_endpoint() {
    let customer = Server::Layer.customer(false).await;
    let key = unique("scope");
    let first = Server::Layer
        .charge(&Call::key(&key), &customer, "1000")
        .await;
    let other_api_key = Call {
        api_key: Some("sk_test_anotheraccount000000000".to_owned()),
        ..Call::key(&key)
    };
    let other_account = Server::Layer
        .charge(&other_api_key, &customer, "1000")
        .await;
    let other_endpoint = Call::key(&key)
        .post(localstripe_url(), "/v1/customers", &[])
        .await;
    assert_eq!(
        answers(&[first, other_account, other_endpoint]),
        [
            answer(200, false, Some(0)),
            answer(200, false, Some(1)),
            refused(400, "idempotency_error", None),
        ]
    );
    assert_eq!(Server::Layer.charges_of(&customer).await, 2);
}

/// A 401 comes before any endpoint (Stripe checks keys first), so it is not kept: the
/// customer's authentication with a wrong client secret, then with the right one, under
/// one key.
#[tokio::test]
async fn an_unauthorized_answer_is_not_kept_and_the_key_stays_free() {
    let customer = localstripe::customer().await;
    let card = localstripe::card(&customer, Card::RequiresAuthentication).await;
    let intent = payment_intent(&customer, &card, "unauthorized").await;
    let id = intent.body["id"].as_str().unwrap();
    let secret = intent.body["client_secret"].as_str().unwrap();
    let path = format!("/v1/payment_intents/{id}/_authenticate");
    let call = Call::key(&unique("unauthorized"));
    let wrong = [("client_secret", "wrong"), ("success", "true")];
    let right = [("client_secret", secret), ("success", "true")];
    let refused = call.post(localstripe_url(), &path, &wrong).await;
    let done = call.post(localstripe_url(), &path, &right).await;
    assert_eq!(
        (refused.status, refused.replayed, done.status, done.replayed),
        (401, false, 200, false),
        "{refused:?} {done:?}"
    );
    assert_eq!(done.body["status"], "succeeded");
}
