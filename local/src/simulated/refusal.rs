//! What Stripe refuses before charging, as far as its documented rules go: a
//! currency it does not take, an amount below the currency's minimum charge, a
//! customer or payment method id of the wrong kind. The simulator answers these as
//! Stripe does: a 400 that stores nothing under the key.

use charge_once::contracts::payment::PaymentError;
use charge_once::domain::order::Order;

/// Stripe's presentment currencies (lower case), as its supported-currencies page
/// lists them.
const CURRENCIES: &[&str] = &[
    "aed", "afn", "all", "amd", "ang", "aoa", "ars", "aud", "awg", "azn", "bam", "bbd", "bdt",
    "bgn", "bif", "bmd", "bnd", "bob", "brl", "bsd", "bwp", "byn", "bzd", "cad", "cdf", "chf",
    "clp", "cny", "cop", "crc", "cve", "czk", "djf", "dkk", "dop", "dzd", "egp", "etb", "eur",
    "fjd", "fkp", "gbp", "gel", "gip", "gmd", "gnf", "gtq", "gyd", "hkd", "hnl", "htg", "huf",
    "idr", "ils", "inr", "isk", "jmd", "jpy", "kes", "kgs", "khr", "kmf", "krw", "kyd", "kzt",
    "lak", "lbp", "lkr", "lrd", "lsl", "mad", "mdl", "mga", "mkd", "mmk", "mnt", "mop", "mur",
    "mvr", "mwk", "mxn", "myr", "mzn", "nad", "ngn", "nio", "nok", "npr", "nzd", "pab", "pen",
    "pgk", "php", "pkr", "pln", "pyg", "qar", "ron", "rsd", "rub", "rwf", "sar", "sbd", "scr",
    "sek", "sgd", "shp", "sle", "sos", "srd", "std", "szl", "thb", "tjs", "top", "try", "ttd",
    "twd", "tzs", "uah", "ugx", "usd", "uyu", "uzs", "vnd", "vuv", "wst", "xaf", "xcd", "xof",
    "xpf", "yer", "zar", "zmw",
];

/// Stripe's minimum charge per settlement currency, in the currency's minor units (a
/// zero-decimal currency's units for JPY). Other currencies: at least one minor unit,
/// as the order's own rule.
const MINIMUMS: &[(&str, u64)] = &[
    ("usd", 50),
    ("aed", 200),
    ("aud", 50),
    ("bgn", 100),
    ("brl", 50),
    ("cad", 50),
    ("chf", 50),
    ("czk", 1500),
    ("dkk", 250),
    ("eur", 50),
    ("gbp", 30),
    ("hkd", 400),
    ("huf", 17500),
    ("inr", 50),
    ("jpy", 50),
    ("mxn", 1000),
    ("myr", 200),
    ("nok", 300),
    ("nzd", 50),
    ("pln", 200),
    ("ron", 200),
    ("sek", 300),
    ("sgd", 50),
    ("thb", 1000),
];

/// What Stripe refuses before charging (a 400, stored under no key), or `None`.
pub(super) fn refusal(order: &Order) -> Option<PaymentError> {
    let currency = order.currency().to_ascii_lowercase();
    let refused = |code: &str| PaymentError::Rejected {
        status: 400,
        code: Some(code.to_owned()),
    };
    if !CURRENCIES.contains(&currency.as_str()) {
        return Some(refused("charge_invalid_parameter"));
    }
    let minimum = MINIMUMS
        .iter()
        .find(|(c, _)| *c == currency)
        .map_or(1, |(_, m)| *m);
    if order.amount() < minimum {
        return Some(refused("amount_too_small"));
    }
    if !order.customer().starts_with("cus_") {
        return Some(refused("resource_missing"));
    }
    if !order.payment_method().starts_with("pm_") {
        return Some(refused("resource_missing"));
    }
    None
}
