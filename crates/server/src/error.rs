//! Errors: [`ApiError`] is what a client sees (an HTTP status and OpenAI's
//! `{"error": {"message", "type", "param", "code"}}` body); [`ServerError`] is what stops
//! the server from starting.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use runit_engine::sampler::SAMPLING_FAILED;
use runit_engine::scheduler::SubmitError;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    #[error("could not listen on {address}: {source}")]
    Bind {
        address: String,
        source: std::io::Error,
    },
}

/// An error answered to the client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's error type: `invalid_request_error`, `authentication_error`, `server_error`.
    pub kind: &'static str,
    /// The request field at fault, when there is one (`messages[1].role`).
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 about the field `param`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.into()),
            code: None,
        }
    }

    /// A 400 about the request as a whole.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// Sets the machine-readable code.
    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// A 401 for a missing or wrong bearer token.
    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "invalid or missing API key (send `Authorization: Bearer KEY`)".into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    /// A 404 for a model this server does not serve.
    pub fn unknown_model(requested: &str, served: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "the model `{requested}` does not exist; this server serves `{served}`"
            ),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// A 503 `server_error` with the given code.
    pub fn service_unavailable(message: impl Into<String>, code: &'static str) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: Some(code),
        }
    }

    /// The answer to a sequence the engine failed: a 400 when the request's own sampling
    /// settings left no token to pick (a grammar, logit biases), else a 500.
    pub fn sequence_failed(message: String) -> ApiError {
        if message.starts_with(SAMPLING_FAILED) {
            ApiError::bad_request(message)
        } else {
            ApiError::internal(message)
        }
    }

    /// A 500 for a failure inside the engine.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// Logs the error in the current span: client errors at info, server errors at warn.
    pub fn log(&self) {
        let status = self.status.as_u16();
        if self.status.is_server_error() {
            tracing::warn!(status, message = %self.message, "request failed");
        } else {
            tracing::info!(status, message = %self.message, "request rejected");
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl From<SubmitError> for ApiError {
    fn from(error: SubmitError) -> ApiError {
        match error {
            SubmitError::QueueFull { .. } => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: error.to_string(),
                kind: "server_error",
                param: None,
                code: Some("queue_full"),
            },
            SubmitError::InvalidParameter { name, .. } => {
                ApiError::invalid(name, error.to_string())
            }
            SubmitError::PromptTooLong { .. } => {
                ApiError::bad_request(error.to_string()).with_code("context_length_exceeded")
            }
            _ => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: error.to_string(),
                kind: "server_error",
                param: None,
                code: None,
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}
