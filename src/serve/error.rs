//! Error answers in OpenAI's shape (TEI clients read `error` too).

use super::*;

/// An error answer in OpenAI's shape (TEI clients read `error` too).
#[derive(Debug)]
pub(super) struct ApiError {
    pub(super) status: StatusCode,
    pub(super) kind: &'static str,
    pub(super) message: String,
    pub(super) retry_after: Option<u64>,
}

impl ApiError {
    pub(super) fn bad(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "bad_request",
            message: message.into(),
            retry_after: None,
        }
    }

    /// 500: the tokenizer panicked on this request (the server goes on).
    pub(super) fn tokenizer_panic(panic: &(dyn std::any::Any + Send)) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "tokenizer",
            message: format!(
                "the tokenizer failed on this request ({}); the server goes on",
                crate::panics::message(panic)
            ),
            retry_after: None,
        }
    }

    /// 413: an input over the model's limit, and truncation not asked for.
    pub(super) fn too_long(message: String) -> ApiError {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            kind: "too_long",
            message,
            retry_after: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": {
                "message": self.message,
                "type": match self.status.as_u16() {
                    400 | 413 | 422 => "invalid_request_error",
                    503 => "overloaded",
                    _ => "server_error",
                },
                "code": self.kind,
            }
        });
        let mut r = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_str(&s.to_string()).expect("digits"),
            );
        }
        r
    }
}
