//! `aqgate send|receive|browse|commit|rollback`: IDAP from the shell, without XML.
//!
//! Without `--session-file` every command is its own transaction: a send or receive carries
//! a trailing AQXmlCommit. With `--session-file FILE` the work stays open in the servlet's
//! session whose token the file keeps (written 0600 when the servlet opens the session;
//! the token is a credential and is never printed), until `commit` or `rollback` with the
//! same file ends it and removes the file. The password comes from `AQGATE_PASSWORD` or
//! `--password-file`, never from the command line.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use aqgate_proto::idap::Selector;
use serde_json::{Value, json};

use crate::answer::{Answer, Received};
use crate::client::{Client, Config, Error};
use crate::request::{self, Outgoing, Payload, Receive};

/// The servlet, the agent and the session of a command.
#[derive(Debug, Clone, clap::Args)]
pub struct Connection {
    /// The servlet's IDAP URL.
    #[arg(long, env = "AQGATE_URL", default_value = "http://127.0.0.1:8470/aqserv")]
    pub url: String,
    /// The agent to log in as (HTTP Basic); its password comes from AQGATE_PASSWORD or --password-file.
    #[arg(long, env = "AQGATE_USER")]
    pub user: String,
    /// A file holding the password (its trailing line end dropped); else AQGATE_PASSWORD.
    #[arg(long)]
    pub password_file: Option<PathBuf>,
    /// PEM CA certificates to trust for an https --url.
    #[arg(long)]
    pub cacert: Option<PathBuf>,
    /// Keep the transaction open in the session this file holds the token of (created when
    /// the servlet opens one; removed by commit or rollback).
    #[arg(long)]
    pub session_file: Option<PathBuf>,
    /// Seconds the whole request may take (a receive's wait included).
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Print the answer as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Which messages a receive or browse takes.
#[derive(Debug, Clone, clap::Args)]
pub struct Selection {
    /// The queue (SCHEMA.NAME).
    pub queue: String,
    /// The consumer (subscriber or recipient) on a multi-consumer queue.
    #[arg(long)]
    pub consumer: Option<String>,
    /// Only a message with this correlation (LIKE patterns with % and _).
    #[arg(long, conflicts_with = "condition")]
    pub correlation: Option<String>,
    /// Only a message this condition holds for (e.g. "priority < 3").
    #[arg(long)]
    pub condition: Option<String>,
    /// Seconds to wait for a message (0: answer at once).
    #[arg(long, default_value_t = 0)]
    pub wait: u64,
}

/// The client commands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ClientCommand {
    /// Send one message to a queue (AQXmlSend; committed unless --session-file).
    #[command(group(clap::ArgGroup::new("payload").required(true).args(["text", "raw_hex", "file"])))]
    Send {
        #[command(flatten)]
        connection: Connection,
        /// The queue (SCHEMA.NAME).
        queue: String,
        /// A JMS text message's text (SYS.AQ$_JMS_TEXT_MESSAGE queues).
        text: Option<String>,
        /// A RAW queue's payload, as hex.
        #[arg(long)]
        raw_hex: Option<String>,
        /// A RAW queue's payload: the bytes of this file.
        #[arg(long)]
        file: Option<PathBuf>,
        /// The message's priority (lower is dequeued first on a priority-ordered queue).
        #[arg(long)]
        priority: Option<i64>,
        /// Seconds before the message may be received.
        #[arg(long)]
        delay: Option<i64>,
        /// Seconds the message waits for a consumer once its delay ended.
        #[arg(long)]
        expiration: Option<i64>,
        /// The message's correlation (what a receive's --correlation matches).
        #[arg(long)]
        correlation: Option<String>,
        /// A recipient (agent name) on a multi-consumer queue; may be repeated.
        #[arg(long = "recipient")]
        recipients: Vec<String>,
    },
    /// Receive (remove) one message (AQXmlReceive; committed unless --session-file).
    Receive {
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        selection: Selection,
    },
    /// Look at the first message without taking it (BROWSE).
    Browse {
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        selection: Selection,
    },
    /// Commit the transaction of --session-file.
    Commit {
        #[command(flatten)]
        connection: Connection,
    },
    /// Roll back the transaction of --session-file.
    Rollback {
        #[command(flatten)]
        connection: Connection,
    },
}

/// Runs `command`, printing its answer; a fault is printed (as JSON with `--json`) and
/// returned as the error, so the process exits non-zero.
pub async fn run(command: ClientCommand) -> anyhow::Result<()> {
    match command {
        ClientCommand::Send {
            connection,
            queue,
            text,
            raw_hex,
            file,
            priority,
            delay,
            expiration,
            correlation,
            recipients,
        } => {
            let mut m = match (text, raw_hex, file) {
                (Some(t), _, _) => Outgoing::text(t),
                (_, Some(h), _) => Outgoing::raw(&hex::decode(h.trim()).context("--raw-hex")?),
                (_, _, Some(f)) => Outgoing::raw(&std::fs::read(&f).with_context(|| f.display().to_string())?),
                _ => bail!("give the payload: TEXT, --raw-hex or --file"),
            };
            (m.priority, m.delay, m.expiration, m.correlation, m.recipients) =
                (priority, delay, expiration, correlation, recipients);
            let commit = connection.session_file.is_none();
            let req = request::send(&queue, vec![m.to_message(1)], commit);
            exchange(&connection, req, Ended::No).await
        }
        ClientCommand::Receive { connection, selection } => {
            let req = receive(&selection, false, connection.session_file.is_none());
            exchange(&connection, req, Ended::No).await
        }
        ClientCommand::Browse { connection, selection } => {
            exchange(&connection, receive(&selection, true, false), Ended::No).await
        }
        ClientCommand::Commit { connection } => {
            exchange(&connection, aqgate_proto::idap::Request::Commit, Ended::Yes).await
        }
        ClientCommand::Rollback { connection } => {
            exchange(&connection, aqgate_proto::idap::Request::Rollback, Ended::Yes).await
        }
    }
}

fn receive(s: &Selection, browse: bool, commit: bool) -> aqgate_proto::idap::Request {
    let mut r = Receive::new(s.queue.clone());
    r.consumer = s.consumer.clone();
    r.wait = Some(s.wait);
    r.selector = match (&s.correlation, &s.condition) {
        (Some(c), _) => Some(Selector::Correlation(c.clone())),
        (_, Some(c)) => Some(Selector::Condition(c.clone())),
        _ => None,
    };
    r.browse = browse;
    r.commit = commit;
    r.to_request()
}

/// Whether the request ends the session's transaction (commit, rollback).
#[derive(PartialEq, Eq, Clone, Copy)]
enum Ended {
    Yes,
    No,
}

async fn exchange(c: &Connection, req: aqgate_proto::idap::Request, ended: Ended) -> anyhow::Result<()> {
    if ended == Ended::Yes && c.session_file.is_none() {
        bail!("commit and rollback end the transaction of a --session-file");
    }
    let url = reqwest::Url::parse(&c.url).with_context(|| format!("--url {}", c.url))?;
    if !url.username().is_empty() || url.password().is_some() {
        bail!("--url carries credentials: give --user, and the password by AQGATE_PASSWORD or --password-file");
    }
    let password = password(c.password_file.as_deref())?;
    let mut config = Config::new(c.url.clone(), c.user.clone(), password);
    config.timeout = std::time::Duration::from_secs(c.timeout.max(1));
    if let Some(f) = &c.cacert {
        config.ca_pem = Some(std::fs::read(f).with_context(|| f.display().to_string())?);
    }
    let client = Client::new(config).map_err(|e| anyhow!(e))?;
    let before = match &c.session_file {
        Some(f) => read_token(f)?,
        None => None,
    };
    client.set_session(before.clone());
    let queue = match &req {
        aqgate_proto::idap::Request::Receive(r) => Some(r.consumer.destination.name.clone()),
        _ => None,
    };
    let mut result = client.call(req).await;
    // No message: the answer names no queue; the one asked of is it.
    if let (Ok(Answer::Received { destination, .. }), Some(q)) = (&mut result, queue)
        && destination.is_empty()
    {
        *destination = q;
    }
    if let Some(f) = &c.session_file {
        let gone = matches!(&result, Err(Error::Fault(x)) if x.code == aqgate_proto::code::SESSION_EXPIRED
            || x.code == aqgate_proto::code::SESSION_UNKNOWN);
        match client.session() {
            _ if (ended == Ended::Yes && result.is_ok()) || gone => remove_token(f)?,
            Some(t) if Some(&t) != before.as_ref() => write_token(f, &t)?,
            _ => {}
        }
    }
    match result {
        Ok(answer) => {
            print(&answer, c.json);
            Ok(())
        }
        Err(Error::Fault(f)) => {
            if c.json {
                println!("{}", json!({ "fault": { "code": f.code, "message": f.message } }));
            }
            Err(anyhow!("fault {}: {}", f.code, f.message))
        }
        Err(e) => Err(anyhow!("{}: {e}", c.url)),
    }
}

/// The password: the file's first line, else `AQGATE_PASSWORD`.
fn password(file: Option<&Path>) -> anyhow::Result<String> {
    match file {
        Some(f) => Ok(std::fs::read_to_string(f)
            .with_context(|| f.display().to_string())?
            .trim_end_matches(['\r', '\n'])
            .to_string()),
        None => std::env::var("AQGATE_PASSWORD")
            .map_err(|_| anyhow!("no password: set AQGATE_PASSWORD or give --password-file FILE")),
    }
}

fn read_token(f: &Path) -> anyhow::Result<Option<String>> {
    match std::fs::read_to_string(f) {
        Ok(t) if t.trim().bytes().all(|b| b.is_ascii_graphic() && b != b';' && b != b',') => {
            Ok(Some(t.trim().to_string()).filter(|t| !t.is_empty()))
        }
        Ok(_) => Err(anyhow!("{}: not a session token", f.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(anyhow!("{}: {e}", f.display())),
    }
}

fn write_token(f: &Path, token: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create(true).truncate(true);
    #[cfg(unix)]
    o.mode(0o600);
    let mut file = o.open(f).with_context(|| f.display().to_string())?;
    writeln!(file, "{token}").with_context(|| f.display().to_string())
}

fn remove_token(f: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(f) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(anyhow!("{}: {e}", f.display())),
        _ => Ok(()),
    }
}

/// The answer as JSON.
pub fn to_json(answer: &Answer) -> Value {
    match answer {
        Answer::Sent { destination, message_ids } => json!({ "queue": destination, "message_ids": message_ids }),
        Answer::Received { destination, messages } => {
            json!({ "queue": destination, "messages": messages.iter().map(message_json).collect::<Vec<_>>() })
        }
        Answer::Committed => json!({ "committed": true }),
        Answer::RolledBack => json!({ "rolled_back": true }),
        Answer::Other(name) => json!({ "answer": name }),
    }
}

fn message_json(m: &Received) -> Value {
    let payload = match &m.payload {
        Payload::Raw(b) => json!({ "raw_hex": hex::encode_upper(b) }),
        Payload::Text(t) => json!({ "text": t }),
        Payload::Xml(x) => json!({ "xml": x }),
    };
    json!({
        "message_id": m.message_id,
        "correlation": m.correlation,
        "priority": m.priority,
        "delivery_count": m.delivery_count,
        "sender": m.sender,
        "payload": payload,
    })
}

fn print(answer: &Answer, as_json: bool) {
    if as_json {
        println!("{}", to_json(answer));
        return;
    }
    match answer {
        Answer::Sent { message_ids, .. } => message_ids.iter().for_each(|id| println!("{id}")),
        Answer::Received { messages, .. } if messages.is_empty() => eprintln!("no message"),
        Answer::Received { messages, .. } => {
            for m in messages {
                let id = m.message_id.as_deref().unwrap_or("-");
                let corr = m.correlation.as_deref().map(|c| format!(" correlation={c}")).unwrap_or_default();
                println!("message {id}{corr} priority={}", m.priority.unwrap_or(0));
                match &m.payload {
                    Payload::Raw(b) => println!("{}", hex::encode_upper(b)),
                    Payload::Text(t) | Payload::Xml(t) => println!("{t}"),
                }
            }
        }
        Answer::Committed => println!("committed"),
        Answer::RolledBack => println!("rolled back"),
        Answer::Other(name) => println!("{name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_print_as_json_with_their_payload_kind() {
        let m = |payload| Received {
            message_id: Some("0A".into()),
            correlation: Some("c".into()),
            priority: Some(1),
            delivery_count: Some(0),
            sender: None,
            payload,
        };
        let a = Answer::Received {
            destination: "Q".into(),
            messages: vec![m(Payload::Raw(vec![1, 2])), m(Payload::Text("t".into())), m(Payload::Xml("<x/>".into()))],
        };
        let v = to_json(&a);
        assert_eq!(v["queue"], "Q");
        assert_eq!(v["messages"][0]["payload"], json!({ "raw_hex": "0102" }));
        assert_eq!(v["messages"][1]["payload"], json!({ "text": "t" }));
        assert_eq!(v["messages"][2]["payload"], json!({ "xml": "<x/>" }));
        assert_eq!(v["messages"][0]["correlation"], "c");
        assert_eq!(to_json(&Answer::Committed), json!({ "committed": true }));
    }

    #[test]
    fn a_session_file_holds_one_token_or_is_refused() {
        let dir = std::env::temp_dir().join(format!("aqgate-client-token-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let f = dir.join("s");
        assert_eq!(read_token(&f).expect("absent"), None);
        write_token(&f, "abc123").expect("write");
        assert_eq!(read_token(&f).expect("read").as_deref(), Some("abc123"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&f).expect("meta").permissions().mode();
            assert_eq!(mode & 0o077, 0, "only the owner reads a session token: {mode:o}");
        }
        std::fs::write(&f, "a b\r\nCookie: x").expect("write");
        assert!(read_token(&f).is_err(), "not a token");
        remove_token(&f).expect("remove");
        remove_token(&f).expect("removing an absent file is no error");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
