//! What a caught panic said: the message of a `panic!` (a `&str` or a `String` payload), for
//! the reports of the places that contain panics (a document's stage, a parser, a request of
//! `serve`, a thread of a run).

use std::any::Any;

/// The message a panic was raised with, or "a panic without a message".
pub fn message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

#[cfg(test)]
mod tests {
    #[test]
    fn both_payloads_and_others() {
        let caught = |f: fn()| std::panic::catch_unwind(f).unwrap_err();
        assert_eq!(super::message(&*caught(|| panic!("static"))), "static");
        assert_eq!(
            super::message(&*caught(|| panic!("{}", 7))),
            "7",
            "formatted: a String"
        );
        assert_eq!(
            super::message(&*caught(|| std::panic::panic_any(3u8))),
            "a panic without a message"
        );
    }
}
