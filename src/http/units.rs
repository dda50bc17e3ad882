//! Units read from a header: a request's cost (`cost_from_header`) and a
//! response's units used (`settle_from_header`), each a whole number.

use std::sync::atomic::{AtomicBool, Ordering};

use http::{HeaderMap, HeaderName};

/// The longest part of a bad value a message quotes: enough to recognise
/// it, and a client's 8 KiB header is not echoed back whole.
const QUOTED: usize = 32;

/// Why a header holds no whole number.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Bad {
    Missing,
    Repeated(usize),
    NotText,
    Empty,
    NotWhole(String),
    TooLarge(String),
}

/// The whole number in the header `name` of `headers`: digits only (no
/// sign, point or space), at most `u64::MAX`, sent once.
fn whole_number(name: &HeaderName, headers: &HeaderMap) -> Result<u64, Bad> {
    let mut values = headers.get_all(name).iter();
    let value = values.next().ok_or(Bad::Missing)?;
    let more = values.count();
    if more > 0 {
        return Err(Bad::Repeated(more + 1));
    }
    let text = value.to_str().map_err(|_| Bad::NotText)?;
    if text.is_empty() {
        return Err(Bad::Empty);
    }
    if !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(Bad::NotWhole(quoted(text)));
    }
    // Digits only: the one error left is a number past `u64::MAX`.
    text.parse().map_err(|_| Bad::TooLarge(quoted(text)))
}

/// `text` (visible ASCII) as a message quotes it: its first [`QUOTED`]
/// characters, and `...` for the rest.
fn quoted(text: &str) -> String {
    if text.len() <= QUOTED {
        format!("{text:?}")
    } else {
        format!("{:?}...", &text[..QUOTED])
    }
}

impl Bad {
    /// What is wrong, after "its header NAME".
    fn say(&self) -> String {
        match self {
            Bad::Missing => "which it lacks".to_owned(),
            Bad::Repeated(times) => format!("which it sends {times} times"),
            Bad::NotText => "whose value is not visible ASCII".to_owned(),
            Bad::Empty => "whose value is empty".to_owned(),
            Bad::NotWhole(value) => format!("whose value {value} is not a whole number"),
            Bad::TooLarge(value) => format!("whose value {value} is more than {}", u64::MAX),
        }
    }
}

/// A request's cost, its header `name`; else the `400` body's detail,
/// naming the header and what was wrong with it.
pub(crate) fn request_cost(name: &HeaderName, headers: &HeaderMap) -> Result<u64, String> {
    whole_number(name, headers)
        .map_err(|bad| format!("the request's cost is its header {name}, {}", bad.say()))
}

/// The units a response used, its header `name`: `None`, keeping the
/// whole cost, when it has none or a bad one; a bad one is the service's
/// fault, logged the first time (`logged`, one flag per layer).
pub(crate) fn units_used(
    name: &HeaderName,
    headers: &HeaderMap,
    logged: &AtomicBool,
) -> Option<u64> {
    match whole_number(name, headers) {
        Ok(used) => Some(used),
        Err(Bad::Missing) => None,
        Err(bad) => {
            // Relaxed: the flag orders nothing; two threads that race may
            // both log.
            if !logged.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "floodgate: a response's units used are its header {name}, {}: such \
                     responses keep their whole cost (logged once)",
                    bad.say()
                );
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(values: &[&[u8]]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append("x-units", HeaderValue::from_bytes(value).unwrap());
        }
        headers
    }

    fn cost(values: &[&[u8]]) -> Result<u64, String> {
        request_cost(&HeaderName::from_static("x-units"), &headers(values))
    }

    #[test]
    fn a_cost_is_digits_only_sent_once() {
        assert_eq!(cost(&[b"0"]), Ok(0));
        assert_eq!(cost(&[b"4096"]), Ok(4_096));
        assert_eq!(cost(&[b"18446744073709551615"]), Ok(u64::MAX));
        let wrong = |values: &[&[u8]]| cost(values).unwrap_err();
        assert_eq!(
            wrong(&[]),
            "the request's cost is its header x-units, which it lacks"
        );
        assert_eq!(
            wrong(&[b"1", b"2"]),
            "the request's cost is its header x-units, which it sends 2 times"
        );
        assert_eq!(
            wrong(&[b"12.5"]),
            r#"the request's cost is its header x-units, whose value "12.5" is not a whole number"#
        );
        for value in [&b"+5"[..], b"-1", b"1e3", b"5 ", b"0x10"] {
            assert!(
                wrong(&[value]).ends_with("is not a whole number"),
                "{value:?}"
            );
        }
        assert_eq!(
            wrong(&[b"18446744073709551616"]),
            "the request's cost is its header x-units, whose value \"18446744073709551616\" \
             is more than 18446744073709551615"
        );
        assert_eq!(
            wrong(&[b""]),
            "the request's cost is its header x-units, whose value is empty"
        );
        assert_eq!(
            wrong(&[b"caf\xc3\xa9"]),
            "the request's cost is its header x-units, whose value is not visible ASCII"
        );
        let long = "9".repeat(40) + "x";
        assert_eq!(
            wrong(&[long.as_bytes()]),
            format!(
                "the request's cost is its header x-units, whose value \"{}\"... is not a \
                 whole number",
                "9".repeat(32)
            )
        );
    }

    #[test]
    fn a_response_without_a_good_figure_keeps_its_whole_cost() {
        let logged = AtomicBool::new(false);
        let used = |values: &[&[u8]]| {
            units_used(
                &HeaderName::from_static("x-units"),
                &headers(values),
                &logged,
            )
        };
        assert_eq!(used(&[b"3"]), Some(3));
        assert_eq!(used(&[]), None);
        assert!(
            !logged.load(Ordering::Relaxed),
            "a missing header is no fault"
        );
        assert_eq!(used(&[b"three"]), None);
        assert_eq!(used(&[b"3", b"4"]), None);
        assert!(logged.load(Ordering::Relaxed));
    }
}
