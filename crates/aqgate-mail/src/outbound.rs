//! Outbound mail: the one path by which aqgate sends a mail (the mail worker's replies, made
//! and signed by `smime::reply_mail`; `mailto:` notifications), to `.eml` files or through
//! an SMTP relay, with an error that
//! says whether sending again can help ([`SendError`]).

use std::time::Duration;

use lettre::Message;

/// Where replies go.
#[derive(Clone)]
pub enum ReplyTransport {
    /// `.eml` files in a directory (the default: nothing leaves the machine).
    Files(std::path::PathBuf),
    /// An SMTP relay (`smtp://host:port`, plain, for a local MTA such as Postfix).
    Relay(String),
}

/// Why a mail was not sent, and whether sending it again can help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// May work later: the relay is unreachable, timed out or answered 4xx, the outbox
    /// directory could not be written.
    #[error("{0}")]
    Transient(String),
    /// Will not work as it is: the relay answered 5xx (no such user, message refused), or
    /// the mail cannot be made (an address that is not one).
    #[error("{0}")]
    Permanent(String),
}

impl SendError {
    pub fn is_permanent(&self) -> bool {
        matches!(self, SendError::Permanent(_))
    }
}

/// A relay's answer as a [`SendError`]: a 5xx is permanent, everything else transient.
fn smtp_error(addr: &str, e: &lettre::transport::smtp::Error) -> SendError {
    if e.is_permanent() {
        SendError::Permanent(format!("relay {addr}: {e}"))
    } else {
        SendError::Transient(format!("relay {addr}: {e}"))
    }
}

/// Sends one message through `transport`: the mail worker's replies and `mailto:`
/// notifications both go this way.
pub async fn send_mail(transport: &ReplyTransport, msg: Message) -> Result<(), SendError> {
    send_raw(transport, msg.envelope(), &msg.formatted()).await
}

/// Sends a message that is already made (`mail`, e.g. a signed reply: its bytes must not
/// change) to `to` with the envelope sender `from`.
pub async fn send_formatted(transport: &ReplyTransport, from: &str, to: &str, mail: &[u8]) -> Result<(), SendError> {
    let address = |a: &str| a.parse::<lettre::Address>().map_err(|e| SendError::Permanent(format!("address {a}: {e}")));
    let envelope = lettre::address::Envelope::new(Some(address(from)?), vec![address(to)?])
        .map_err(|e| SendError::Permanent(format!("envelope: {e}")))?;
    send_raw(transport, &envelope, mail).await
}

async fn send_raw(
    transport: &ReplyTransport,
    envelope: &lettre::address::Envelope,
    body: &[u8],
) -> Result<(), SendError> {
    match transport {
        ReplyTransport::Files(dir) => {
            let (dir, body) = (dir.clone(), body.to_vec());
            tokio::task::spawn_blocking(move || write_outbox(&dir, &body))
                .await
                .map_err(|e| SendError::Transient(format!("outbox: {e}")))?
                .map(|_| ())
                .map_err(|e| SendError::Transient(format!("outbox: {e}")))
        }
        ReplyTransport::Relay(url) => relay_send(url, envelope, body).await,
    }
}

/// Writes one mail into the outbox directory as `<uuid>.eml`, whole or not at all, as a
/// maildir does: written and synced under `tmp/`, then renamed into place and the directory
/// synced. A reader of the directory (a user's `ls -t`, a test polling for the reply) never
/// sees a file that is still being written, and a crash leaves no half mail behind.
pub fn write_outbox(dir: &std::path::Path, mail: &[u8]) -> std::io::Result<std::path::PathBuf> {
    use std::io::Write;
    let tmp_dir = dir.join("tmp");
    std::fs::create_dir_all(&tmp_dir)?;
    let name = format!("{}.eml", uuid::Uuid::new_v4());
    let tmp = tmp_dir.join(&name);
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(mail)?;
    file.sync_all()?;
    drop(file);
    let path = dir.join(&name);
    std::fs::rename(&tmp, &path)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(path)
}

/// Sends through a plain SMTP relay (`smtp://HOST:PORT`, a local MTA) with lettre's SMTP
/// client on a socket of our own: lettre's transport leaves Nagle's algorithm on, and its
/// small final write (`.` after the body) then waits for the relay's delayed ACK — 40 ms
/// per mail. With TCP_NODELAY a mail costs one transaction on a connection that is kept
/// for the next mail (see [`RelayPool`]).
async fn relay_send(url: &str, envelope: &lettre::address::Envelope, body: &[u8]) -> Result<(), SendError> {
    let addr = crate::reinject::parse_target(url).map_err(SendError::Transient)?;
    if let Some(mut conn) = RelayPool::take(&addr) {
        match tokio::time::timeout(Duration::from_secs(60), conn.send(envelope, body)).await {
            Ok(Ok(_)) => {
                RelayPool::put(&addr, conn);
                return Ok(());
            }
            // The relay answered with a code: that is its verdict, not a broken connection.
            Ok(Err(e)) if e.status().is_some() => return Err(smtp_error(&addr, &e)),
            Err(_) => return Err(SendError::Transient(format!("relay {addr}: timed out"))),
            // The relay closed the idle connection meanwhile: try once more on a new one.
            Ok(Err(e)) => tracing::debug!(error = %e, "pooled relay connection broken; reconnecting"),
        }
    }
    let fresh = async {
        use lettre::transport::smtp::client::AsyncSmtpConnection;
        use lettre::transport::smtp::extension::ClientId;
        let tcp = tokio::net::TcpStream::connect(&addr)
            .await
            .map_err(|e| SendError::Transient(format!("relay {addr}: {e}")))?;
        let _ = tcp.set_nodelay(true);
        let hello = ClientId::Domain(hostname());
        let mut conn = AsyncSmtpConnection::connect_with_transport(Box::new(tcp), &hello)
            .await
            .map_err(|e| smtp_error(&addr, &e))?;
        match conn.send(envelope, body).await {
            Ok(_) => {
                RelayPool::put(&addr, conn);
                Ok(())
            }
            Err(e) => {
                let _ = conn.quit().await;
                Err(smtp_error(&addr, &e))
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), fresh)
        .await
        .map_err(|_| SendError::Transient(format!("relay {addr}: timed out")))?
}

/// Idle connections to relays, reused for the next mail as Postfix's connection cache does:
/// a reply then costs MAIL, RCPT and DATA instead of a connection, banner, EHLO and QUIT.
/// A connection idle for [`RELAY_IDLE`] is closed (relays time idle clients out, Postfix
/// after 300 s); at most [`RELAY_POOLED`] are kept per process.
struct RelayPool;

type Pooled = (String, lettre::transport::smtp::client::AsyncSmtpConnection, std::time::Instant);

const RELAY_IDLE: Duration = Duration::from_secs(10);
const RELAY_POOLED: usize = 16;

impl RelayPool {
    fn slots() -> std::sync::MutexGuard<'static, Vec<Pooled>> {
        static POOL: std::sync::OnceLock<std::sync::Mutex<Vec<Pooled>>> = std::sync::OnceLock::new();
        POOL.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take(addr: &str) -> Option<lettre::transport::smtp::client::AsyncSmtpConnection> {
        let mut slots = Self::slots();
        slots.retain(|(_, _, idle_since)| idle_since.elapsed() < RELAY_IDLE);
        let i = slots.iter().rposition(|(a, _, _)| a == addr)?;
        Some(slots.swap_remove(i).1)
    }

    fn put(addr: &str, conn: lettre::transport::smtp::client::AsyncSmtpConnection) {
        if conn.has_broken() {
            return;
        }
        let mut slots = Self::slots();
        if slots.len() < RELAY_POOLED {
            slots.push((addr.to_string(), conn, std::time::Instant::now()));
        }
    }
}

/// This machine's host name (`/etc/hostname`, if it is a DNS name), else `localhost`: said
/// in EHLO to the relay, and naming this process in propagation leases.
pub fn hostname() -> String {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.'))
            .unwrap_or_else(|| "localhost".to_string())
    })
    .clone()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    use super::*;

    /// What the fake relay does.
    #[derive(Clone, Copy)]
    enum Relay {
        /// Keeps connections open for further transactions.
        Keep,
        /// Closes every connection after its first message (an idle timeout, early).
        CloseAfterMessage,
        /// Takes one message per connection, then refuses recipients with 550.
        RefuseAfterFirst,
        /// Refuses every recipient for now with 451 (greylisting, a full queue).
        TryLater,
    }

    struct Counts {
        connections: AtomicUsize,
        messages: AtomicUsize,
    }

    async fn fake_relay(mode: Relay) -> (String, Arc<Counts>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("fake relay");
        let url = format!("smtp://{}", listener.local_addr().expect("fake relay"));
        let counts = Arc::new(Counts { connections: AtomicUsize::new(0), messages: AtomicUsize::new(0) });
        let c = counts.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                c.connections.fetch_add(1, Ordering::SeqCst);
                let c = c.clone();
                tokio::spawn(async move {
                    let (read, mut write) = socket.into_split();
                    let mut lines = BufReader::new(read).lines();
                    write.write_all(b"220 fake relay\r\n").await.expect("fake relay");
                    let mut in_data = false;
                    let mut taken = 0;
                    while let Ok(Some(line)) = lines.next_line().await {
                        if in_data {
                            if line == "." {
                                in_data = false;
                                c.messages.fetch_add(1, Ordering::SeqCst);
                                taken += 1;
                                write.write_all(b"250 2.0.0 queued\r\n").await.expect("fake relay");
                                if matches!(mode, Relay::CloseAfterMessage) {
                                    return;
                                }
                            }
                            continue;
                        }
                        let verb = line.get(..4).unwrap_or_default().to_ascii_uppercase();
                        let reply: &[u8] = match verb.as_str() {
                            "EHLO" | "HELO" => b"250 fake relay\r\n",
                            "RCPT" if matches!(mode, Relay::TryLater) => b"451 4.7.1 try again later\r\n",
                            "RCPT" if matches!(mode, Relay::RefuseAfterFirst) && taken > 0 => {
                                b"550 5.1.1 no such user\r\n"
                            }
                            "DATA" => {
                                in_data = true;
                                b"354 go ahead\r\n"
                            }
                            "QUIT" => {
                                let _ = write.write_all(b"221 bye\r\n").await;
                                return;
                            }
                            _ => b"250 ok\r\n",
                        };
                        write.write_all(reply).await.expect("fake relay");
                    }
                });
            }
        });
        (url, counts)
    }

    fn message(n: usize) -> Message {
        Message::builder()
            .from("aq@example.com".parse().expect("fake relay"))
            .to("scott@example.com".parse().expect("fake relay"))
            .subject(format!("Re: request {n}"))
            .body(format!("<reply n=\"{n}\"/>"))
            .expect("fake relay")
    }

    #[test]
    fn the_outbox_gets_whole_mails_only() {
        let dir = std::env::temp_dir().join(format!("aqgate-outbox-unit-{}", uuid::Uuid::new_v4()));
        let mail = b"From: aq@example.com\r\n\r\nbody\r\n".repeat(1000);
        let a = write_outbox(&dir, &mail).unwrap();
        let b = write_outbox(&dir, b"second").unwrap();
        assert_ne!(a, b, "each mail its own file");
        assert_eq!(std::fs::read(&a).unwrap(), mail);
        assert_eq!(std::fs::read(&b).unwrap(), b"second");
        let emls: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "eml"))
            .collect();
        assert_eq!(emls.len(), 2);
        assert_eq!(std::fs::read_dir(dir.join("tmp")).unwrap().count(), 0, "nothing left half-written");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn relay_connections_are_reused() {
        let (url, counts) = fake_relay(Relay::Keep).await;
        let transport = ReplyTransport::Relay(url);
        for n in 0..3 {
            send_mail(&transport, message(n)).await.unwrap();
        }
        assert_eq!(counts.messages.load(Ordering::SeqCst), 3);
        assert_eq!(counts.connections.load(Ordering::SeqCst), 1, "one connection for three mails");
    }

    #[tokio::test]
    async fn a_connection_the_relay_closed_is_replaced() {
        let (url, counts) = fake_relay(Relay::CloseAfterMessage).await;
        let transport = ReplyTransport::Relay(url);
        for n in 0..3 {
            send_mail(&transport, message(n)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await; // let the close arrive
        }
        assert_eq!(counts.messages.load(Ordering::SeqCst), 3, "every mail delivered once");
        assert_eq!(counts.connections.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_refusal_on_a_pooled_connection_is_the_answer() {
        let (url, counts) = fake_relay(Relay::RefuseAfterFirst).await;
        let transport = ReplyTransport::Relay(url);
        send_mail(&transport, message(0)).await.unwrap();
        let err = send_mail(&transport, message(1)).await.unwrap_err();
        assert!(err.is_permanent(), "a 550 is permanent: {err:?}");
        assert!(err.to_string().contains("no such user"), "{err}");
        // Refused on the kept connection, and not tried again on a new one.
        assert_eq!(counts.connections.load(Ordering::SeqCst), 1);
        assert_eq!(counts.messages.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_4xx_or_no_relay_is_transient() {
        let (url, _) = fake_relay(Relay::TryLater).await;
        let err = send_mail(&ReplyTransport::Relay(url), message(0)).await.unwrap_err();
        assert!(!err.is_permanent(), "a 451 is transient: {err:?}");
        assert!(err.to_string().contains("try again later"), "{err}");
        // Nobody listening.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("smtp://{}", closed.local_addr().unwrap());
        drop(closed);
        let err = send_mail(&ReplyTransport::Relay(url), message(0)).await.unwrap_err();
        assert!(!err.is_permanent(), "no relay is transient: {err:?}");
    }
}
