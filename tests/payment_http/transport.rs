//! What the transport does to a charge: closed ports, untrusted certificates, silent
//! listeners, redirects, answers of every status, the key and its secret.

use super::*;
use charge_once::domain::ForOrder;

#[tokio::test]
async fn a_closed_port_fails_within_the_timeout_and_keeps_the_key() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let provider = provider_at(&url, Duration::from_secs(2));
    let started = Instant::now();
    let result = provider
        .charge(&order("ord-closed", 100, "cus_x"), "cobro#ord-closed#1")
        .await;
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(
        matches!(
            result,
            Err(PaymentError::Retryable {
                kind: FailureKind::Connection,
                ..
            })
        ),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_payment_api_whose_certificate_no_trusted_root_signed_is_refused_and_keeps_the_key() {
    let server = harness::servers::SelfSignedTls::start();
    let provider = provider_at(&server.url, Duration::from_secs(5));
    let result = provider
        .charge(
            &order("ord-untrusted", 100, "cus_x"),
            "cobro#ord-untrusted#1",
        )
        .await;
    match &result {
        Err(
            error @ PaymentError::Retryable {
                kind: FailureKind::Connection,
                ..
            },
        ) => {
            assert!(
                chain(error).contains("invalid peer certificate"),
                "{}",
                chain(error)
            );
        }
        other => panic!("expected a refused certificate, got {other:?}"),
    }
}

#[tokio::test]
async fn the_store_refuses_an_endpoint_whose_certificate_no_trusted_root_signed() {
    let server = harness::servers::SelfSignedTls::start();
    let store = charge_once::adapters::dynamodb::DynamoStore::new(
        harness::servers::Backend::client_at(&server.url),
        "orders".to_owned(),
    );
    let order = order("ord-untrusted", 100, "cus_x");
    let error =
        charge_once::contracts::store::IdempotencyStore::get(&store, &Key::for_order(&order))
            .await
            .unwrap_err();
    assert!(
        chain(&error).contains("invalid peer certificate"),
        "{}",
        chain(&error)
    );
}

#[tokio::test]
async fn a_certificate_in_aws_ca_bundle_is_trusted_by_both_clients() {
    let server = harness::servers::SelfSignedTls::start();
    let tls = charge_once::adapters::tls::Tls::new(Some(&server.cert)).unwrap();
    // The handshake succeeds and the server answers a GET with an HTML page: no
    // charge. (openssl s_server answers GET only: a POST waits, so the store's read
    // below ends in its timeout, after the handshake.)
    let provider = HttpProvider::new(
        &server.url,
        &Secret::new(TEST_KEY.into()),
        Duration::from_secs(5),
        &tls,
    )
    .unwrap();
    let looked_up = provider.payment_by_id("ch_bundle").await;
    match &looked_up {
        Err(error) => assert!(
            chain(error).contains("unexpected provider response"),
            "{}",
            chain(error)
        ),
        Ok(found) => panic!("an HTML page is no charge: {found:?}"),
    }
    let store = charge_once::adapters::dynamodb::DynamoStore::new(
        aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::Config::builder()
                .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
                .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
                .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
                    "test", "test", None, None, "tests",
                ))
                .endpoint_url(&server.url)
                .http_client(charge_once::adapters::sdk_http::client(&tls))
                .timeout_config(
                    aws_sdk_dynamodb::config::timeout::TimeoutConfig::builder()
                        .operation_timeout(Duration::from_secs(2))
                        .build(),
                )
                .build(),
        ),
        "orders".to_owned(),
    );
    let order = order("ord-bundle", 100, "cus_x");
    let read =
        charge_once::contracts::store::IdempotencyStore::get(&store, &Key::for_order(&order)).await;
    let error = chain(&read.unwrap_err());
    assert!(error.contains("timeout"), "{error}");
    assert!(!error.contains("certificate"), "{error}");
}

#[tokio::test]
async fn a_listener_that_never_answers_fails_within_the_timeout_and_keeps_the_key() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    // Accepts, reads nothing, answers nothing; bounded by the test.
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        for _ in 0..4 {
            if let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
    });
    let timeout = Duration::from_millis(800);
    let provider = provider_at(&url, timeout);
    let started = Instant::now();
    let result = provider
        .charge(&order("ord-silent", 100, "cus_x"), "cobro#ord-silent#1")
        .await;
    let elapsed = started.elapsed();
    assert!(
        elapsed >= timeout && elapsed < timeout + Duration::from_secs(2),
        "{elapsed:?}"
    );
    assert!(
        matches!(
            result,
            Err(PaymentError::Retryable {
                kind: FailureKind::Timeout,
                ..
            })
        ),
        "{result:?}"
    );
    silent.abort();
}

#[tokio::test]
async fn a_redirect_is_not_followed_and_fails_retryably_keeping_the_key() {
    // Answers every request with a 307 to localstripe's own PaymentIntents: a client
    // that followed it would POST the payment there again, and it would be charged.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let location = format!("{}/v1/payment_intents", harness::servers::localstripe_url());
    let redirecting = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        for _ in 0..4 {
            let Ok((mut socket, _)) = listener.accept().await else {
                break;
            };
            let mut request = [0u8; 8192];
            let _ = socket.read(&mut request).await;
            let answer = format!(
                "HTTP/1.1 307 Temporary Redirect\r\nlocation: {location}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
            let _ = socket.write_all(answer.as_bytes()).await;
        }
    });
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&unique_id(), 4200, &payer);
    let redirected = provider_at(&url, PAYMENT_TIMEOUT);
    let result = redirected.charge(&order, &key(&order, 1)).await;
    assert!(
        matches!(
            result,
            Err(PaymentError::Retryable {
                kind: FailureKind::Redirect(307),
                ..
            })
        ),
        "{result:?}"
    );
    assert!(
        localstripe::payment_intents_of(&payer.customer)
            .await
            .is_empty(),
        "the redirect was followed: localstripe charged"
    );
    redirecting.abort();
}

#[tokio::test]
async fn a_402_whose_decline_code_asks_for_authentication_awaits_the_customer() {
    // Stripe's card error for an issuer that wants authentication: `code` is the
    // generic `card_declined`, the reason is in `decline_code`.
    let body = r#"{"error":{"type":"card_error","code":"card_declined","decline_code":"authentication_required","charge":"ch_1","payment_intent":{"id":"pi_awaits","object":"payment_intent","status":"requires_payment_method"}}}"#;
    let result = charged_against(json_answer("402 Payment Required", "", body)).await;
    assert!(
        matches!(
            &result,
            Err(PaymentError::AuthenticationRequired { payment_id: Some(id) }) if id == "pi_awaits"
        ),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_3ds_partners_error_is_the_providers_trouble_retried_with_the_key_never_a_decline() {
    // 2026-10-28.endive's code for a 3-D Secure partner that failed Stripe.
    let body = r#"{"error":{"type":"card_error","code":"three_d_secure_authentication_upstream_error","message":"An error with the authentication partner prevented the request."}}"#;
    for status in ["402 Payment Required", "400 Bad Request"] {
        let result = charged_against(json_answer(status, "", body)).await;
        assert!(
            matches!(
                &result,
                Err(PaymentError::Retryable {
                    kind: FailureKind::AuthenticationUpstream,
                    ..
                })
            ),
            "{status}: {result:?}"
        );
    }
}

#[tokio::test]
async fn a_429_is_a_rate_limit_named_by_its_header_or_a_lock_by_its_code() {
    let cases = [
        (
            "stripe-rate-limited-reason: endpoint-rate\r\n",
            "rate_limit",
            FailureKind::RateLimited(Limiter::EndpointRate),
        ),
        ("", "rate_limit", FailureKind::RateLimited(Limiter::Unnamed)),
        ("", "lock_timeout", FailureKind::Lock),
        // A limiter that names itself is a rate limit, whatever the code says.
        (
            "stripe-rate-limited-reason: endpoint-rate\r\n",
            "lock_timeout",
            FailureKind::RateLimited(Limiter::EndpointRate),
        ),
    ];
    let mut seen = Vec::new();
    for (headers, code, _) in &cases {
        let body = format!(r#"{{"error":{{"type":"invalid_request_error","code":"{code}"}}}}"#);
        match charged_against(json_answer("429 Too Many Requests", headers, &body)).await {
            Err(PaymentError::Retryable { kind, .. }) => seen.push(kind),
            other => panic!("{headers:?} {code}: expected a retryable failure, got {other:?}"),
        }
    }
    let expected: Vec<FailureKind> = cases.iter().map(|(_, _, kind)| *kind).collect();
    assert_eq!(seen, expected);
}

#[tokio::test]
async fn a_2xx_payment_without_a_status_is_not_a_receipt() {
    // A provider (or a proxy) that answers 200 with a payment id and no status: the
    // outcome is unknown, as the lookup and the audit read such a payment.
    let (url, _, task) = answering(json_answer(
        "200 OK",
        "",
        r#"{"id":"pi_without_status","object":"payment_intent"}"#,
    ))
    .await;
    let order = order(&unique_id(), 4200, "cus_any");
    let result = provider_at(&url, PAYMENT_TIMEOUT)
        .charge(&order, &key(&order, 1))
        .await;
    assert!(
        matches!(
            &result,
            Err(PaymentError::Pending { payment_id, status })
                if payment_id == "pi_without_status" && status == "unknown"
        ),
        "{result:?}"
    );
    task.abort();
}

/// Stripe's `Stripe-Should-Retry: false` comes before the status: a 503 that carries
/// it is not retried within the invocation; the same 503 without it is, once.
#[tokio::test]
async fn a_failure_the_provider_advises_not_to_retry_is_not_retried_within_the_invocation() {
    let error = r#"{"error":{"type":"api_error","message":"try later"}}"#;
    let mut requests = Vec::new();
    for advice in ["stripe-should-retry: false\r\n", ""] {
        let (url, seen, task) =
            answering(json_answer("503 Service Unavailable", advice, error)).await;
        let order = order(&unique_id(), 1300, "cus_any");
        let h = Harness::new(provider_at(&url, PAYMENT_TIMEOUT)).await;
        let failed = invoke_order(&h, &order).await;
        assert_eq!(failed.len(), 1);
        let record = h.record(order.id()).await.unwrap();
        assert_eq!((record.state, record.attempt), (State::Free, Some(1)));
        requests.push(seen.load(Ordering::SeqCst));
        task.abort();
    }
    assert_eq!(
        requests,
        [1, 2],
        "advised not to retry: one request; not advised: one retry under the same key"
    );
}

#[tokio::test]
async fn a_wrong_key_fails_the_record_and_no_fragment_of_it_reaches_the_logs() {
    let wrong_key = "qZxJvWpKmQbTrYgHfNdLsXcV";
    let logs = Captured::default();
    let _guard = logs.install();

    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&unique_id(), 1500, &payer);
    let h = Harness::new(provider_with_key(wrong_key, PAYMENT_TIMEOUT)).await;
    let failed = invoke_order(&h, &order).await;
    assert_eq!(failed.len(), 1);
    let record = h.record(order.id()).await.unwrap();
    assert_eq!(record.state, State::Free);
    assert_eq!(record.attempt, Some(1), "a 401 keeps the key");
    assert!(
        localstripe::payment_intents_of(&payer.customer)
            .await
            .is_empty()
    );

    let text = logs.text();
    assert!(text.contains("provider refused the API key"), "{text}");
    for window in wrong_key.as_bytes().windows(4) {
        let fragment = std::str::from_utf8(window).unwrap();
        assert!(
            !text.contains(fragment),
            "key fragment {fragment:?} in logs:\n{text}"
        );
    }
}

#[tokio::test]
async fn the_api_key_is_read_from_a_secrets_manager_secret_in_moto() {
    let sdk = harness::servers::moto_sdk_config();
    let secrets = aws_sdk_secretsmanager::Client::new(&sdk);
    let name = format!("charge-once/{}", uuid::Uuid::new_v4().simple());
    let created = secrets
        .create_secret()
        .name(&name)
        .secret_string(r#"{"api_key":"sk_test_fromsecret"}"#)
        .send()
        .await
        .unwrap();
    let arn = created.arn().unwrap().to_owned();
    let config = Config::from_lookup(|var| match var {
        "PAYMENT_API_KEY_SECRET_ARN" => Some(arn.clone()),
        "PAYMENT_API_KEY" => Some("sk_test_loses".to_owned()),
        _ => None,
    })
    .unwrap();
    let key = api_key::load(&config, &sdk).await.unwrap();
    assert_eq!(
        key.expose(),
        "sk_test_fromsecret",
        "the ARN wins over the plain variable"
    );

    let missing = Config::from_lookup(|var| {
        (var == "PAYMENT_API_KEY_SECRET_ARN").then(|| format!("{arn}-missing"))
    })
    .unwrap();
    let err = api_key::load(&missing, &sdk).await.unwrap_err();
    assert!(
        err.to_string().starts_with("PAYMENT_API_KEY_SECRET_ARN="),
        "{err}"
    );
}
