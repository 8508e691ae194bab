//! Parsing a request body without holding up the other requests. A small document is
//! parsed where it arrived; a large one (over [`OFF_WORKER_BYTES`]) on a blocking thread,
//! at most one per CPU at a time, so that the runtime's worker (one on a small host) keeps
//! answering everyone else meanwhile: 4 MiB of XML takes tens of milliseconds to parse
//! (more with a hundred thousand small elements), and every other request would wait as long.

use std::sync::Arc;

use axum::body::Bytes;
use tokio::sync::Semaphore;

use aqgate_core::engine::Engine;
use aqgate_proto::idap::{self, CodecError, Envelope, Limits, Request};

/// Bodies up to this size are parsed inline: handing them to a thread would cost about
/// what parsing them does.
pub const OFF_WORKER_BYTES: usize = 64 * 1024;

/// The turns for large parses: one per CPU.
#[derive(Debug)]
pub struct LargeParses(Semaphore);

impl LargeParses {
    pub fn new() -> Arc<Self> {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        Arc::new(Self(Semaphore::new(cpus)))
    }
}

/// Parses `body` as an IDAP request (see the module's documentation); a recipient list the
/// parser stopped at is counted in `engine`'s metric of such refusals.
pub async fn request(
    engine: &Engine,
    turns: &LargeParses,
    body: &Bytes,
    limits: &Limits,
) -> Result<Envelope<Request>, CodecError> {
    let parsed = parse(turns, body, limits).await;
    if let Err(CodecError::TooManyRecipients(_)) = &parsed {
        engine.recipient_list_refused();
    }
    parsed
}

async fn parse(turns: &LargeParses, body: &Bytes, limits: &Limits) -> Result<Envelope<Request>, CodecError> {
    if body.len() <= OFF_WORKER_BYTES {
        return idap::parse_request(body, limits);
    }
    // The semaphore is never closed: a turn always comes.
    let _turn = turns.0.acquire().await.map_err(|_| CodecError::Unsupported("shutting down".into()))?;
    let (body, limits) = (body.clone(), *limits);
    tokio::task::spawn_blocking(move || idap::parse_request(&body, &limits))
        .await
        .unwrap_or_else(|e| Err(CodecError::Unsupported(format!("the parse did not finish: {e}"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(payload_bytes: usize) -> Bytes {
        let raw = "AB".repeat(payload_bytes);
        Bytes::from(format!(
            r#"<Envelope xmlns="http://ns.oracle.com/AQ/schemas/envelope"><Body><AQXmlSend xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>Q</destination></producer_options><message_set><message_count>1</message_count><message><message_number>1</message_number><message_header/><message_payload><raw>{raw}</raw></message_payload></message></message_set></AQXmlSend></Body></Envelope>"#
        ))
    }

    #[tokio::test]
    async fn small_and_large_bodies_parse_alike() {
        let turns = LargeParses::new();
        let limits = Limits::default();
        for n in [10, OFF_WORKER_BYTES] {
            let body = send(n);
            let inline = idap::parse_request(&body, &limits).expect("valid");
            assert_eq!(parse(&turns, &body, &limits).await.expect("valid"), inline);
        }
        let tight = Limits { max_bytes: OFF_WORKER_BYTES * 2, ..limits };
        let err = parse(&turns, &send(OFF_WORKER_BYTES * 2), &tight).await.expect_err("over the limit");
        assert_eq!(err.error_code(), CodecError::TOO_LARGE);
    }
}
