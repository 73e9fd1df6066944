//! DynamoDB's item-size rules: the size of an item (attribute names and values), what
//! a write or a read of it consumes, and what it takes in storage (the size plus 100
//! bytes of per-item overhead). `make bench` prices each contender's table with these
//! where the store does not report consumed capacity (a refused conditional write), and
//! `tests/store_contract.rs` shows them agreeing with the units dynalite reports.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

/// Bytes DynamoDB adds to every item for storage (and indexing).
pub const STORAGE_OVERHEAD: u64 = 100;
/// A write unit covers up to 1 KB of item; a read unit up to 4 KB (strongly
/// consistent; an eventually consistent read is half a unit).
pub const WRITE_UNIT_BYTES: u64 = 1024;
pub const READ_UNIT_BYTES: u64 = 4096;

/// The size of an item as DynamoDB counts it: UTF-8 bytes of each attribute name
/// plus the size of its value.
pub fn item_size(item: &HashMap<String, AttributeValue>) -> u64 {
    item.iter()
        .map(|(name, value)| name.len() as u64 + value_size(value))
        .sum()
}

/// The bytes an item takes in storage: its size plus the per-item overhead.
pub fn stored_size(item: &HashMap<String, AttributeValue>) -> u64 {
    item_size(item) + STORAGE_OVERHEAD
}

/// Write units of one write of an item of `size` bytes (an update: the larger of the
/// item before and after).
pub fn write_units(size: u64) -> f64 {
    size.div_ceil(WRITE_UNIT_BYTES).max(1) as f64
}

/// Read units of one read of an item of `size` bytes.
pub fn read_units(size: u64, consistent: bool) -> f64 {
    let units = size.div_ceil(READ_UNIT_BYTES).max(1) as f64;
    if consistent { units } else { units / 2.0 }
}

/// The size of one value: strings and binaries by their bytes, numbers by their
/// significant digits (two per byte, plus one), booleans and nulls one byte, sets the
/// sum of their members, lists and maps 3 bytes plus one per element plus the
/// elements (and the names, in a map).
pub fn value_size(value: &AttributeValue) -> u64 {
    match value {
        AttributeValue::S(s) => s.len() as u64,
        AttributeValue::N(n) => number_size(n),
        AttributeValue::B(b) => b.as_ref().len() as u64,
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::Ss(set) => set.iter().map(|s| s.len() as u64).sum(),
        AttributeValue::Ns(set) => set.iter().map(|n| number_size(n)).sum(),
        AttributeValue::Bs(set) => set.iter().map(|b| b.as_ref().len() as u64).sum(),
        AttributeValue::L(list) => 3 + list.iter().map(|v| 1 + value_size(v)).sum::<u64>(),
        AttributeValue::M(map) => {
            3 + map
                .iter()
                .map(|(name, v)| 1 + name.len() as u64 + value_size(v))
                .sum::<u64>()
        }
        _ => 0,
    }
}

/// A number's size: its significant digits (leading and trailing zeros dropped) are
/// stored two per byte after one byte of exponent, with one more byte when the digits
/// do not fall on the pairs' boundary, and one for a negative sign.
pub fn number_size(text: &str) -> u64 {
    let negative = text.starts_with('-');
    let unsigned = text.trim_start_matches(['-', '+']);
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i64>().unwrap_or(0)),
        None => (unsigned, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits: String = whole.chars().chain(fraction.chars()).collect();
    let Some(first) = digits.find(|c: char| c != '0') else {
        return 1; // zero
    };
    let significant = digits[first..].trim_end_matches('0');
    let count = significant.len() as i64;
    // The power of ten of the first significant digit.
    let power = whole.len() as i64 - 1 - first as i64 + exponent;
    let aligned = count % 2 == 1 || power % 2 != 0;
    (1 + (count + 1) / 2 + i64::from(!aligned) + i64::from(negative)) as u64
}
