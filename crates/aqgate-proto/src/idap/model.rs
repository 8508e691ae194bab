//! The IDAP / AQ XML data model: typed requests and responses, free of any I/O.
//!
//! Names follow Oracle's AQ XML specification (Tables 9-1 to 9-7): `producer_options`, `message_set`,
//! `consumer_options`, `register_options`, `status_response`, ...

/// Namespace of the IDAP envelope (`Envelope`, `Header`, `Body`, `Fault`).
pub const ENVELOPE_NS: &str = "http://ns.oracle.com/AQ/schemas/envelope";
/// Namespace of the AQ XML access schema (`AQXmlSend`, ...).
pub const ACCESS_NS: &str = "http://ns.oracle.com/AQ/schemas/access";
/// Namespace of aqgate's own extension elements inside IDAP documents (IDAP has no element
/// for them): `delivery_mode` in `producer_options` and `consumer_options`, `listen` in
/// `AQXmlReceive` and `listen_result` in its response, and the attribute `type_name` on a
/// `SYS.ANYDATA` payload. An element of this namespace anywhere else is refused, as any
/// unknown element is.
pub const AQGATE_NS: &str = "urn:aqgate:idap";

/// A generic XML element, used for payloads and header entries.
///
/// `name` is the element name as written (a prefix is kept, so XML payloads round-trip);
/// `attrs` are the attributes as written, namespace declarations included.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct XmlNode {
    pub name: String,
    pub attrs: Vec<(String, String)>,
    pub children: Vec<XmlChild>,
}

/// A child of an [`XmlNode`]: mixed content is kept in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XmlChild {
    Element(XmlNode),
    Text(String),
}

impl XmlNode {
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into(), attrs: Vec::new(), children: Vec::new() }
    }

    /// An element holding only `text`.
    pub fn with_text(name: impl Into<String>, text: impl Into<String>) -> Self {
        let mut n = Self::new(name);
        n.children.push(XmlChild::Text(text.into()));
        n
    }

    /// The local part of the name (after any `prefix:`).
    pub fn local_name(&self) -> &str {
        self.name.rsplit(':').next().unwrap_or(&self.name)
    }

    /// The namespace of the element's name, as its own declarations give it (a header entry
    /// or payload root carries those of its prefix); `None` in no namespace.
    pub fn namespace(&self) -> Option<&str> {
        let decl = match self.name.split_once(':') {
            Some((prefix, _)) => format!("xmlns:{prefix}"),
            None => "xmlns".to_string(),
        };
        self.attrs.iter().find(|(k, _)| *k == decl).map(|(_, v)| v.as_str()).filter(|v| !v.is_empty())
    }

    /// Child elements, in order.
    pub fn elements(&self) -> impl Iterator<Item = &XmlNode> {
        self.children.iter().filter_map(|c| match c {
            XmlChild::Element(e) => Some(e),
            XmlChild::Text(_) => None,
        })
    }

    /// First child element whose local name equals `name` (ASCII case-insensitive).
    pub fn child(&self, name: &str) -> Option<&XmlNode> {
        self.elements().find(|e| e.local_name().eq_ignore_ascii_case(name))
    }

    /// Concatenated text children (not descendants).
    pub fn text(&self) -> String {
        let mut s = String::new();
        for c in &self.children {
            if let XmlChild::Text(t) = c {
                s.push_str(t);
            }
        }
        s
    }

    pub fn push(&mut self, child: XmlNode) -> &mut Self {
        self.children.push(XmlChild::Element(child));
        self
    }
}

/// A parsed IDAP document: header entries plus the body's method element.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope<T> {
    /// Entries of `IDAP:Header`, e.g. a transaction id; available to the engine.
    pub headers: Vec<XmlNode>,
    pub body: T,
}

/// How a destination name is interpreted (`lookup_type` attribute).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LookupType {
    /// `schema.queue_name` in the database (the default).
    #[default]
    Database,
    /// Resolved through the directory.
    Ldap,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    pub name: String,
    pub lookup: LookupType,
}

impl Destination {
    pub fn database(name: impl Into<String>) -> Self {
        Self { name: name.into(), lookup: LookupType::Database }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Visibility {
    /// Part of the session's transaction (the default).
    #[default]
    OnCommit,
    /// A transaction of its own, visible when the request completes.
    Immediate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DequeueMode {
    #[default]
    Remove,
    Browse,
    Locked,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NavigationMode {
    FirstMessage,
    #[default]
    NextMessage,
    NextTransaction,
}

/// Oracle's DELIVERY_MODE (10.2): whether a message is kept in the queue table or in
/// memory (buffered), and which of the two a dequeue takes. Written as the extension
/// element `delivery_mode` in [`AQGATE_NS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeliveryMode {
    /// Stored, transactional (the default, and IDAP's only kind).
    #[default]
    Persistent,
    /// Kept in the memory of the process that took it; not transactional, lost on restart
    /// unless it was spilled to the store.
    Buffered,
    /// Dequeue only: either kind.
    PersistentOrBuffered,
}

/// An AQ agent as written in `sender_id`, `recipient_list` or `reply_to`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AgentRef {
    pub name: Option<String>,
    pub address: Option<String>,
    pub protocol: Option<i32>,
    /// Resolved through the directory when present.
    pub alias: Option<String>,
}

/// `message_header`: the properties a client sends, and the server returns on dequeue.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MessageHeader {
    pub message_id: Option<String>,
    pub correlation: Option<String>,
    /// Seconds, counted from the end of the delay.
    pub expiration: Option<i64>,
    /// Seconds.
    pub delay: Option<i64>,
    pub priority: Option<i64>,
    pub delivery_count: Option<i64>,
    pub sender_id: Option<AgentRef>,
    pub recipient_list: Vec<AgentRef>,
    pub message_state: Option<i32>,
    pub exception_queue: Option<String>,
}

/// One `message` of a `message_set`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub number: Option<u32>,
    pub header: MessageHeader,
    /// The single element inside `message_payload` (e.g. `<ORDER_TYP>`, `<raw>`,
    /// `<jms_text_message>`).
    pub payload: XmlNode,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerOptions {
    pub destination: Destination,
    pub visibility: Visibility,
    pub transformation: Option<String>,
    /// `aqgate:delivery_mode`: never [`DeliveryMode::PersistentOrBuffered`] (the parser
    /// refuses it for an enqueue).
    pub delivery_mode: DeliveryMode,
}

/// AQXmlSend / AQXmlPublish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnqueueRequest {
    pub producer: ProducerOptions,
    pub messages: Vec<Message>,
    /// A trailing `<AQXmlCommit/>`.
    pub commit: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    Correlation(String),
    MessageId(String),
    /// SQL-WHERE-like boolean expression; never pasted into SQL.
    Condition(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerOptions {
    pub destination: Destination,
    pub consumer_name: Option<String>,
    /// Seconds; `None` means the server's default.
    pub wait_time: Option<u64>,
    pub selector: Option<Selector>,
    pub visibility: Visibility,
    pub dequeue_mode: DequeueMode,
    pub navigation: NavigationMode,
    pub transformation: Option<String>,
    /// `aqgate:delivery_mode`: which messages the dequeue takes.
    pub delivery_mode: DeliveryMode,
}

/// AQXmlReceive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiveRequest {
    pub consumer: ConsumerOptions,
    pub commit: bool,
}

/// Most agents one LISTEN may name.
pub const MAX_LISTEN_AGENTS: usize = 32;

/// One agent of a LISTEN: a queue, and the consumer for a multi-consumer queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAgent {
    pub destination: Destination,
    pub consumer_name: Option<String>,
}

/// `AQXmlReceive` holding `aqgate:listen` (Oracle's DBMS_AQ.LISTEN): which of these agents
/// has a message, waiting up to `wait_time` for one; nothing is dequeued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenRequest {
    /// 1 to [`MAX_LISTEN_AGENTS`] of them.
    pub agents: Vec<ListenAgent>,
    /// Seconds; `None` means the server's default.
    pub wait_time: Option<u64>,
}

/// `aqgate:listen_result`: the agent that has a message (queue name as the server knows it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenResult {
    pub destination: String,
    pub consumer_name: Option<String>,
}

/// AQXmlRegister.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisterRequest {
    pub destination: Destination,
    pub consumer_name: Option<String>,
    pub notify_url: String,
    pub commit: bool,
}

/// The method element of a request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Send(EnqueueRequest),
    Publish(EnqueueRequest),
    Receive(ReceiveRequest),
    /// An `AQXmlReceive` with `aqgate:listen` instead of `consumer_options`.
    Listen(ListenRequest),
    Register(RegisterRequest),
    Commit,
    Rollback,
}

impl Request {
    /// The method element's name, as used in the `IDAPMethodName` header.
    pub fn method_name(&self) -> &'static str {
        match self {
            Request::Send(_) => "AQXmlSend",
            Request::Publish(_) => "AQXmlPublish",
            Request::Receive(_) | Request::Listen(_) => "AQXmlReceive",
            Request::Register(_) => "AQXmlRegister",
            Request::Commit => "AQXmlCommit",
            Request::Rollback => "AQXmlRollback",
        }
    }
}

/// `status_response`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusResponse {
    /// 0 success, -1 failure.
    pub status_code: i32,
    pub error_code: Option<i32>,
    pub error_message: Option<String>,
}

impl StatusResponse {
    pub fn ok() -> Self {
        Self { status_code: 0, error_code: None, error_message: None }
    }
}

/// `send_result` / `publish_result`: one destination, one message_id per message sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnqueueResult {
    pub destination: String,
    pub message_ids: Vec<String>,
}

/// `receive_result`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiveResult {
    pub destination: String,
    pub messages: Vec<Message>,
}

/// AQXmlNotification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    pub destination: String,
    pub consumer_name: Option<String>,
    /// Message properties only (payload elements are not sent).
    pub messages: Vec<MessageHeader>,
}

/// Whether a fault is the client's doing or the server's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    Client,
    Server,
}

/// `Fault` (in the envelope namespace): faultcode, faultstring, detail/status_response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    /// Oracle-style error number (e.g. 24010), also carried in `status_response/error_code`.
    pub code: i32,
    pub message: String,
}

/// The method element of a response body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    Send(StatusResponse, Option<EnqueueResult>),
    Publish(StatusResponse, Option<EnqueueResult>),
    Receive(StatusResponse, Option<ReceiveResult>),
    /// `AQXmlReceiveResponse` to a LISTEN: `aqgate:listen_result` instead of `receive_result`.
    Listen(StatusResponse, Option<ListenResult>),
    Register(StatusResponse),
    Commit(StatusResponse),
    Rollback(StatusResponse),
    Notification(Notification),
    Fault(Fault),
}
