//! Parsing IDAP documents (requests, responses, faults, notifications) into the typed
//! model of [`super::model`].
//!
//! Parsing runs in two steps:
//!
//! 1. `build_tree` reads the bytes with quick-xml's namespace-aware `NsReader` into a small
//!    tree that borrows names and text from the document (a copy only where a reference was
//!    expanded). This is where the hostile-input guards live: a byte limit checked before
//!    anything else, UTF-8 only, no DOCTYPE (so no DTD and no custom entities: only the five
//!    predefined entities and character references are expanded), and a depth limit that is
//!    enforced while reading, so nesting can never exhaust the stack later on.
//! 2. The `parse_*` walkers check that tree against the IDAP and AQ XML schemas (Tables 9-1
//!    to 9-7 of Oracle's AQ XML specification) and build the model values. Errors name the element path,
//!    e.g. `/Envelope/Body/AQXmlSend/producer_options/foo`, which is written out only for
//!    an error (see `Path`).
//!
//! # Namespaces
//!
//! `Envelope`, `Header`, `Body` and `Fault` (and the fault's `faultcode`, `faultstring`,
//! `detail`) must be in [`ENVELOPE_NS`] or in no namespace; the method element and every AQ
//! element below it must be in [`ACCESS_NS`] or in no namespace ("the receiver processes IDAP
//! messages without namespaces as though they had the correct namespaces"). Namespaces are
//! resolved per the XML rules, so a default `xmlns` is inherited and prefixed names such as
//! `<IDAP:Envelope xmlns:IDAP="...">` work. Any other namespace on one of these structural
//! elements is a [`CodecError::WrongNamespace`]. Note that this makes an AQ method element
//! that *inherits* the envelope namespace (no `xmlns` of its own under a defaulted envelope)
//! a namespace error, as the specification requires.
//!
//! Payload elements and header entries are free content and may use any namespace.
//!
//! # Attributes
//!
//! Namespace declarations and namespace-qualified attributes (`xml:lang`,
//! `IDAP:encodingStyle`, `xsi:type`, ...) are ignored on every structural element. An
//! unqualified attribute must be one the schema defines (only `lookup_type`, on `destination`
//! and `recipient_list`); anything else is [`CodecError::Invalid`].
//!
//! # Leniency, and what is accepted
//!
//! * Children of a structural element may come in any order; each may appear at most once
//!   (except repeated ones such as `message`, `message_id`, `recipient`).
//! * Scalar values are trimmed of surrounding whitespace; payload text is kept exactly.
//! * Enumerated values (`lookup_type`, `visibility`, `dequeue_mode`, `navigation_mode`) are
//!   matched ASCII case-insensitively. Element names are case-sensitive, as in XML.
//! * `wait_time`: a non-negative number of seconds; `NO_WAIT` means 0; `FOREVER` (or `-1`,
//!   DBMS_AQ's value for it) means `None`, the server's default: an HTTP request cannot hold
//!   a connection forever, so the server's own (maximum) wait applies.
//! * `message_id` (in headers, selectors and results) must be non-empty, even-length hex
//!   (it is a RAW in Oracle).
//! * `recipient_list` accepts wrapped agents, `<recipient>` (what the writer emits) or
//!   `<agent>`, each holding `agent_name`/`address`/`protocol`/`agent_alias`; or, as a
//!   shorthand, those fields as direct children, where a field already set for the current
//!   recipient starts the next one (`<agent_name>a</agent_name><agent_name>b</agent_name>`
//!   is two recipients). The two forms cannot be mixed. `lookup_type="LDAP"` on the list is
//!   [`CodecError::Unsupported`] (the model has no way to carry it).
//! * A trailing `<AQXmlCommit/>` must be the last child of the method element.
//! * Comments and processing instructions are skipped everywhere (also inside payloads).
//! * In payloads, whitespace-only text between child elements is dropped; the text of leaf
//!   elements and non-blank mixed content are kept verbatim (unescaped). Element and attribute
//!   names are kept as written, namespace declarations included; a namespace prefix that the
//!   payload uses but that is declared *outside* it (e.g. `xmlns:xsi` on the envelope) is
//!   re-declared on the payload root, so the payload stays well-formed when written elsewhere.
//! * Notification messages carry no payload; a `message_payload` there is ignored.

use super::model::*;

mod listen;
mod request;
mod response;
mod tree;
mod walk;

use self::listen::*;
use self::request::*;
use self::response::*;
use self::tree::*;
use self::walk::*;

/// Bounds on what a single document may cost to parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Maximum document size in bytes, checked before any parsing.
    pub max_bytes: usize,
    /// Maximum element nesting depth, counting `Envelope` as 1 (payloads included).
    pub max_depth: usize,
    /// Maximum number of `message` elements in one `message_set`.
    pub max_messages: usize,
    /// The recipients one message may name (the engine refuses a longer list whole). The
    /// parser itself stops at [`RECIPIENT_ENTRIES_PER_RECIPIENT`] times as many entries of
    /// one `recipient_list` (more than any list within the limit can hold), so that a
    /// hostile list costs its bytes to read but not a tree of a hundred thousand agents.
    pub max_recipients: usize,
}

/// Child nodes of a `recipient_list` the parser builds per allowed recipient: a recipient
/// in the shorthand form is up to four fields, each with whitespace around it.
pub const RECIPIENT_ENTRIES_PER_RECIPIENT: usize = 8;

/// Attributes (namespace declarations included) allowed on one element. quick-xml's
/// duplicate-attribute check is quadratic in this number, so it must stay small.
pub const MAX_ATTRIBUTES: usize = 256;

/// Namespace declarations allowed in scope at once. Resolving every element and prefixed
/// attribute scans the declarations in scope, so this bounds the cost of a hostile document.
pub const MAX_NAMESPACES_IN_SCOPE: usize = 128;

impl Default for Limits {
    fn default() -> Self {
        Self { max_bytes: 4 * 1024 * 1024, max_depth: 64, max_messages: 10_000, max_recipients: 1024 }
    }
}

/// Why a document was rejected. Every variant is the client's fault.
///
/// Each kind has an Oracle-style error number ([`CodecError::error_code`]), from a block
/// that aqgate keeps for the codec and that no AQ condition in `crate::code` uses:
///
/// | variant          | code  | meaning                                                    |
/// |------------------|-------|------------------------------------------------------------|
/// | `Malformed`      | 25441 | not well-formed XML, invalid UTF-8, unknown entity/prefix  |
/// | `Doctype`        | 25442 | a `<!DOCTYPE>` (DTDs and custom entities are refused)      |
/// | `TooLarge`       | 25443 | over `max_bytes`, or a `message_set` over `max_messages`   |
/// | `TooManyRecipients` | 25443 | a `recipient_list` far over `max_recipients`           |
/// | `TooDeep`        | 25444 | elements nested deeper than `max_depth`                    |
/// | `WrongNamespace` | 25445 | a structural element, or `IDAPMethodName`, in a wrong namespace |
/// | `Invalid`        | 25446 | well-formed but not a valid IDAP document (unknown, missing or duplicate element, bad number or enum value, `message_count` mismatch, duplicate `message_number`, bad hex) |
/// | `Unsupported`    | 25447 | valid IDAP that aqgate does not implement (e.g. a non-UTF-8 encoding) |
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("malformed XML: {0}")]
    Malformed(String),
    #[error("DOCTYPE declarations are not allowed")]
    Doctype,
    #[error("document too large: {0}")]
    TooLarge(String),
    /// A `recipient_list` far over `Limits::max_recipients` (code 25443, as `TooLarge`; a
    /// variant of its own so that the server can count it with the other recipient-list
    /// refusals).
    #[error("document too large: {0}")]
    TooManyRecipients(String),
    #[error("document too deeply nested: more than {0} levels of elements")]
    TooDeep(usize),
    #[error("wrong namespace: {0}")]
    WrongNamespace(String),
    #[error("invalid IDAP document: {0}")]
    Invalid(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
}

impl CodecError {
    pub const MALFORMED: i32 = 25441;
    pub const DOCTYPE: i32 = 25442;
    pub const TOO_LARGE: i32 = 25443;
    pub const TOO_DEEP: i32 = 25444;
    pub const WRONG_NAMESPACE: i32 = 25445;
    pub const INVALID: i32 = 25446;
    pub const UNSUPPORTED: i32 = 25447;

    /// The Oracle-style error number for this kind of error (see the table on the type).
    pub fn error_code(&self) -> i32 {
        match self {
            CodecError::Malformed(_) => Self::MALFORMED,
            CodecError::Doctype => Self::DOCTYPE,
            CodecError::TooLarge(_) | CodecError::TooManyRecipients(_) => Self::TOO_LARGE,
            CodecError::TooDeep(_) => Self::TOO_DEEP,
            CodecError::WrongNamespace(_) => Self::WRONG_NAMESPACE,
            CodecError::Invalid(_) => Self::INVALID,
            CodecError::Unsupported(_) => Self::UNSUPPORTED,
        }
    }

    /// The client fault to answer with.
    pub fn to_fault(&self) -> Fault {
        Fault { kind: FaultKind::Client, code: self.error_code(), message: self.to_string() }
    }
}

type Result<T, E = CodecError> = std::result::Result<T, E>;

/// Parses a client request: `AQXmlSend`, `AQXmlPublish`, `AQXmlReceive`, `AQXmlRegister`,
/// `AQXmlCommit` or `AQXmlRollback`.
pub fn parse_request(bytes: &[u8], limits: &Limits) -> Result<Envelope<Request>> {
    parse_envelope(bytes, limits, parse_request_method)
}

/// Parses a server response, including `Fault` and `AQXmlNotification`.
pub fn parse_response(bytes: &[u8], limits: &Limits) -> Result<Envelope<Response>> {
    parse_envelope(bytes, limits, parse_response_method)
}

/// Checks the HTTP `IDAPMethodName` header (`URI#method`) against the parsed body: the URI
/// must be [`ACCESS_NS`] and the method the body's method element. Surrounding whitespace
/// and double quotes (as in SOAPAction-style headers) are tolerated.
pub fn check_method_header(value: &str, req: &Request) -> Result<()> {
    let value = value.trim();
    let value = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(value);
    // The method name cannot contain '#', so the last '#' separates it from the URI.
    let Some((uri, method)) = value.rsplit_once('#') else {
        return Err(CodecError::Invalid(format!("IDAPMethodName '{}' is not of the form URI#method", snip(value))));
    };
    if uri != ACCESS_NS {
        return Err(CodecError::WrongNamespace(format!(
            "IDAPMethodName namespace '{}' is not '{ACCESS_NS}'",
            snip(uri)
        )));
    }
    if method != req.method_name() {
        return Err(CodecError::Invalid(format!(
            "IDAPMethodName names method '{}' but the body holds '{}'",
            snip(method),
            req.method_name()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
