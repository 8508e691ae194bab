//! The answers every page shares: a rendered template, 400, 403, 404, 503 and the redirect,
//! each an HTML page of its own (the console's headers are added by `security`).

use askama::Template;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// A rendered page; a template that fails to render is a 500 (logged).
pub(crate) fn html(status: StatusCode, t: &impl Template) -> Response {
    match t.render() {
        Ok(body) => (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "console: a template did not render");
            (StatusCode::INTERNAL_SERVER_ERROR, "the page could not be rendered\n").into_response()
        }
    }
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage<'a> {
    title: &'a str,
    text: &'a str,
}

pub(crate) fn forbidden(text: &str) -> Response {
    html(StatusCode::FORBIDDEN, &ErrorPage { title: "Forbidden", text })
}

/// A value the caller gave that cannot be used: 400, with why.
pub(crate) fn bad_request(text: &str) -> Response {
    html(StatusCode::BAD_REQUEST, &ErrorPage { title: "Bad request", text })
}

pub(crate) fn not_found_because(text: &str) -> Response {
    html(StatusCode::NOT_FOUND, &ErrorPage { title: "Not found", text })
}

/// A store that did not answer: 503, the reason logged, not shown.
pub(crate) fn unavailable(e: &dyn std::fmt::Display) -> Response {
    tracing::warn!(error = %e, "console: the store did not answer");
    html(StatusCode::SERVICE_UNAVAILABLE, &ErrorPage { title: "Unavailable", text: "The store did not answer." })
}

pub(crate) fn see_other(to: &'static str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response()
}
