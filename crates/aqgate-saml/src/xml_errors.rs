//! libxml2's and xmlsec's own error reports. Left alone, both print to the process's
//! standard error, with text taken from the document a client sent, once per request. Here
//! they go to `tracing` instead: escaped, cut short and rate-limited. The first parser
//! error of a parse is also kept, so that the refusal can tell the client why.
//!
//! The only `unsafe` code of the crate: the two C callbacks and their registration.
//! libxml2 keeps its error handler per thread, so [`install`] is called by every entry
//! point that parses (they run on the blocking pool, on any of its threads).
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

type XmlError = libxml::bindings::_xmlError;
type StructuredHandler = unsafe extern "C" fn(*mut c_void, *const XmlError);
type XmlSecHandler =
    unsafe extern "C" fn(*const c_char, c_int, *const c_char, *const c_char, *const c_char, c_int, *const c_char);

// The libxml crate's own binding of `xmlSetStructuredErrorFunc` types the handler as a
// Rust-ABI function; this is the C declaration (libxml2's xmlerror.h, xmlsec's errors.h).
unsafe extern "C" {
    fn xmlSetStructuredErrorFunc(ctx: *mut c_void, handler: Option<StructuredHandler>);
    fn xmlSecErrorsSetCallback(callback: Option<XmlSecHandler>);
    fn xmlSecErrorsDefaultCallbackEnableOutput(enabled: c_int);
}

thread_local! {
    static FIRST_ERROR: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Routes this thread's libxml2 errors here, and keeps xmlsec's default callback from
/// printing.
pub(crate) fn install() {
    static QUIET: Once = Once::new();
    // SAFETY: these only store what they are given; the handler is `extern "C"` with the C
    // signature and never unwinds (nothing in it panics).
    unsafe { xmlSetStructuredErrorFunc(std::ptr::null_mut(), Some(on_libxml)) };
    QUIET.call_once(|| unsafe { xmlSecErrorsDefaultCallbackEnableOutput(0) });
}

/// Routes xmlsec's errors here. xmlsec-openssl's initialisation, which samael runs in its
/// first verification, sets its own callback, so this is called after every verification:
/// from the first one on, later errors are ours (before that, the default callback is
/// quiet, see [`install`]). The lock keeps our own writes of the pointer apart.
pub(crate) fn route_xmlsec() {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _held = LOCK.lock();
    // SAFETY: as in `install`.
    unsafe { xmlSecErrorsSetCallback(Some(on_xmlsec)) };
}

/// Forgets this thread's first parser error (before a parse).
pub(crate) fn clear() {
    FIRST_ERROR.with(|e| {
        if let Ok(mut e) = e.try_borrow_mut() {
            *e = None;
        }
    });
}

/// This thread's first libxml2 error since [`clear`], already cleaned.
pub(crate) fn take_first() -> Option<String> {
    FIRST_ERROR.with(|e| e.try_borrow_mut().ok().and_then(|mut e| e.take()))
}

/// Reads a C string libxml2 or xmlsec handed over (null: empty).
///
/// # Safety
/// `p` is null or a NUL-terminated string valid for the call.
unsafe fn text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the caller's promise.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// At most 200 characters of `s`, trimmed, with control characters escaped (what a
/// document says stays one line of a log, and cannot pose as another).
pub(crate) fn clean(s: &str) -> String {
    const MAX: usize = 200;
    let s = s.trim();
    let mut out: String = s.chars().take(MAX).flat_map(char::escape_debug).collect();
    if s.chars().count() > MAX {
        out.push('…');
    }
    out
}

unsafe extern "C" fn on_libxml(_ctx: *mut c_void, error: *const XmlError) {
    if error.is_null() {
        return;
    }
    // SAFETY: libxml2 passes a valid error for the duration of the call.
    let message = clean(&unsafe { text((*error).message) });
    FIRST_ERROR.with(|e| {
        if let Ok(mut e) = e.try_borrow_mut()
            && e.is_none()
        {
            *e = Some(message.clone());
        }
    });
    report("libxml2", &message);
}

unsafe extern "C" fn on_xmlsec(
    _file: *const c_char,
    _line: c_int,
    func: *const c_char,
    _object: *const c_char,
    subject: *const c_char,
    reason: c_int,
    msg: *const c_char,
) {
    // SAFETY: xmlsec passes NUL-terminated strings or nulls, valid for the call.
    let (func, subject, msg) = unsafe { (text(func), text(subject), text(msg)) };
    report("xmlsec", &clean(&format!("{func}: {subject}: {msg} (reason {reason})")));
}

/// Reports per minute; the rest are counted and the count reported with the next window.
const PER_MINUTE: u64 = 30;
static WINDOW: AtomicU64 = AtomicU64::new(0);
static IN_WINDOW: AtomicU64 = AtomicU64::new(0);
static SUPPRESSED: AtomicU64 = AtomicU64::new(0);

fn report(source: &'static str, message: &str) {
    let minute = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() / 60);
    if WINDOW.swap(minute, Ordering::Relaxed) != minute {
        IN_WINDOW.store(0, Ordering::Relaxed);
        let dropped = SUPPRESSED.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            tracing::info!(target: "aqgate_saml::xml", dropped, "XML library messages left out (rate limit)");
        }
    }
    if IN_WINDOW.fetch_add(1, Ordering::Relaxed) < PER_MINUTE {
        tracing::info!(target: "aqgate_saml::xml", source, detail = message, "XML library message");
    } else {
        SUPPRESSED.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleaning_escapes_control_characters_and_cuts_long_text() {
        assert_eq!(clean(" a\nb\u{1b}[31m "), "a\\nb\\u{1b}[31m");
        let long = "x".repeat(500);
        assert_eq!(clean(&long).chars().count(), 201);
    }

    #[test]
    fn a_parse_error_is_kept_for_the_refusal() {
        install();
        clear();
        let options = libxml::parser::ParserOptions { recover: false, ..Default::default() };
        let r = libxml::parser::Parser::default().parse_string_with_options("<a><b></a>", options);
        assert!(r.is_err());
        let first = take_first().expect("the parser's error");
        assert!(first.contains("mismatch") || first.contains("end tag"), "{first}");
        assert_eq!(take_first(), None, "taken once");
    }
}
