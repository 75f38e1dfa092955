//! Middleware around every route: request bodies are read whole, under the body limit and
//! the body timeout, before a handler runs (a `Content-Length` above the limit is refused
//! before a byte of the body is read); and an error response that carries no body of its own
//! (a 405 from the router, say) gets an OpenAI-shaped one.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::error::ApiError;
use crate::AppState;

/// Reads the request body whole within the limits, then runs the handler on it.
pub(crate) async fn read_body(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let limit = state.config.max_body_bytes;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return closing(too_large(limit));
    }
    let (parts, body) = request.into_parts();
    let timeout = state.config.connections.body_timeout;
    let bytes = match tokio::time::timeout(timeout, Limited::new(body, limit).collect()).await {
        Err(_) => {
            return closing(ApiError {
                status: StatusCode::REQUEST_TIMEOUT,
                message: format!(
                    "the request body did not arrive within {} s",
                    timeout.as_secs_f64()
                ),
                kind: "invalid_request_error",
                param: None,
                code: Some("request_timeout"),
            })
        }
        Ok(Err(error)) if error.is::<LengthLimitError>() => return closing(too_large(limit)),
        Ok(Err(error)) => {
            return closing(ApiError::bad_request(format!(
                "could not read the body: {error}"
            )))
        }
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// The 413 for a body over `limit` bytes.
pub(crate) fn too_large(limit: usize) -> ApiError {
    ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        message: format!("the request body is larger than the limit of {limit} bytes"),
        kind: "invalid_request_error",
        param: None,
        code: Some("request_too_large"),
    }
}

/// The error's answer, closing the connection: what is left of the request is not read.
fn closing(error: ApiError) -> Response {
    error.log();
    let mut response = error.into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Gives an error response without a body (the router's 405, say) an OpenAI-shaped one.
pub(crate) async fn error_bodies(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    let status = response.status();
    let is_error = status.is_client_error() || status.is_server_error();
    if !is_error || response.headers().contains_key(header::CONTENT_TYPE) {
        return response;
    }
    let message = match status {
        StatusCode::METHOD_NOT_ALLOWED => format!("{method} is not allowed on {path}"),
        _ => format!(
            "{} ({method} {path})",
            status.canonical_reason().unwrap_or("error")
        ),
    };
    let error = ApiError {
        status,
        message,
        kind: if status.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        },
        param: None,
        code: code_of(status),
    };
    error.log();
    let (mut parts, _) = response.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    let answer = error.into_response();
    for (name, value) in answer.headers() {
        parts.headers.insert(name, value.clone());
    }
    Response::from_parts(parts, answer.into_body())
}

/// A machine-readable code for the statuses the router answers on its own.
fn code_of(status: StatusCode) -> Option<&'static str> {
    match status {
        StatusCode::METHOD_NOT_ALLOWED => Some("method_not_allowed"),
        StatusCode::NOT_FOUND => Some("not_found"),
        StatusCode::PAYLOAD_TOO_LARGE => Some("request_too_large"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => Some("unsupported_media_type"),
        _ => None,
    }
}
