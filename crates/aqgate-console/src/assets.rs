//! The console's stylesheet and script, embedded in the binary and served from
//! `/console/assets/`: no build step, no package manager, no CDN.

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

const CSS: &str = include_str!("../assets/console.css");
const JS: &str = include_str!("../assets/console.js");

pub(crate) async fn asset(Path(name): Path<String>) -> Response {
    match name.as_str() {
        "console.css" => ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS).into_response(),
        "console.js" => ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], JS).into_response(),
        _ => (StatusCode::NOT_FOUND, "no such asset\n").into_response(),
    }
}
